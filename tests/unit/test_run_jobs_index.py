"""A run's Jobs from kopf's index: the Job as the client's V1Job (what job_view reads), a Job just
created but not yet seen by the watch is running, the LIST only before the index is known. The
indices are kept on the process's parts as a handler does (``ix.capture``), with when each run's
Jobs were last LISTed."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client

from reversi.adapters.kube import Kube
from reversi.handlers import indices as ix
from reversi.handlers import runtime
from reversi.settings import OperatorSettings


class Listing(Kube):
    def __init__(self) -> None:
        super().__init__(client.ApiClient(client.Configuration()))
        self.lists: list[tuple[str, str]] = []

    def list_jobs(self, namespace, selector):
        self.lists.append((namespace, selector))
        return {}


def body(name: str, conditions: list[dict]) -> dict:
    return {"metadata": {"name": name, "namespace": "shop", "labels": {"reversi.dev/run-uid": "u1"}},
            "status": {"conditions": conditions}}


def captured(kube: Kube, jobs: dict[Any, Any]) -> ix.Indices:
    """The indices as the operator's parts keep them once a handler ran with kopf's ``jobs``."""
    parts = runtime.Parts(OperatorSettings(), kube)
    ix.capture(parts, {"manifest_specs": {}, "run_jobs": jobs})
    assert parts.indices is not None
    return parts.indices


def test_jobs_come_from_the_index_as_v1jobs():
    kube = Listing()
    done = body("rv-u1-0-1", [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}])
    indices = captured(kube, {("shop", "u1"): [done]})
    indices.listings.last[("shop", "u1")] = time.monotonic()  # listed a moment ago: no resync due
    jobs = ix.jobs_of_run(indices, kube, "shop", "u1")
    job = jobs.get("rv-u1-0-1")
    assert isinstance(job, client.V1Job) and job.metadata.name == "rv-u1-0-1"
    assert job.status.conditions[0].type == "Complete" and job.status.conditions[0].last_transition_time.year == 2026
    assert jobs.get("rv-u1-1-1") is None
    assert kube.lists == []  # no LIST


def test_a_job_created_here_is_running_until_the_watch_brings_it():
    kube = Listing()
    kube._created[("shop", "rv-u1-2-1")] = time.monotonic()  # as create_job records it
    index: dict[Any, Any] = {}  # kopf's index: a live mapping the watch updates
    indices = captured(kube, index)
    indices.listings.last[("shop", "u1")] = time.monotonic()
    job = ix.jobs_of_run(indices, kube, "shop", "u1").get("rv-u1-2-1")
    assert job is not None and not job.status.conditions  # no condition: running
    index[("shop", "u1")] = [body("rv-u1-2-1", [])]  # the watch brings it
    assert ix.jobs_of_run(indices, kube, "shop", "u1").get("rv-u1-2-1") is not None
    assert not kube.created_recently("shop", "rv-u1-2-1", 60)  # seen: a later deletion is seen as such
    del index[("shop", "u1")]  # the watch saw it deleted
    assert ix.jobs_of_run(indices, kube, "shop", "u1").get("rv-u1-2-1") is None


def test_a_list_before_the_index_is_known():
    kube = Listing()
    assert ix.jobs_of_run(None, kube, "shop", "u1") == {}
    assert kube.lists == [("shop", "reversi.dev/run-uid=u1")]


def test_a_runs_jobs_are_listed_on_the_first_read_and_once_a_minute_after():
    kube = Listing()
    indices = captured(kube, {})
    ix.jobs_of_run(indices, kube, "shop", "u2")
    ix.jobs_of_run(indices, kube, "shop", "u2")
    assert kube.lists == [("shop", "reversi.dev/run-uid=u2")]  # the first read only
    indices.listings.last[("shop", "u2")] -= ix.RESYNC_SECONDS
    ix.jobs_of_run(indices, kube, "shop", "u2")
    assert len(kube.lists) == 2


def test_the_record_of_listings_is_the_processs_own():
    """Another operator in the same process (kopf started again) LISTs a run's Jobs on its first
    read, whatever an earlier one did; a later handler's capture keeps the first record."""
    kube = Listing()
    first_parts = runtime.Parts(OperatorSettings(), kube)
    ix.capture(first_parts, {"manifest_specs": {}, "run_jobs": {}})
    assert first_parts.indices is not None
    ix.jobs_of_run(first_parts.indices, kube, "shop", "u3")
    ix.capture(first_parts, {"manifest_specs": {}, "run_jobs": {}})  # the next handler
    ix.jobs_of_run(first_parts.indices, kube, "shop", "u3")
    assert kube.lists == [("shop", "reversi.dev/run-uid=u3")]
    ix.jobs_of_run(captured(kube, {}), kube, "shop", "u3")
    assert len(kube.lists) == 2
