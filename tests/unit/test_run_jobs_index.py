"""A run's Jobs from kopf's index: the Job as the client's V1Job (what job_view reads), a Job just
created but not yet seen by the watch is running, the LIST only before the index is known."""

from __future__ import annotations

import time

from kubernetes import client

from reversi.adapters.kube import Kube
from reversi.handlers import indices as ix


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


def test_jobs_come_from_the_index_as_v1jobs():
    kube = Listing()
    ix._listed[("shop", "u1")] = time.monotonic()  # listed a moment ago: no resync due
    done = body("rv-u1-0-1", [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}])
    indices = ix.Indices(manifests={}, jobs={("shop", "u1"): [done]})
    jobs = ix.jobs_of_run(indices, kube, "shop", "u1")
    job = jobs.get("rv-u1-0-1")
    assert isinstance(job, client.V1Job) and job.metadata.name == "rv-u1-0-1"
    assert job.status.conditions[0].type == "Complete" and job.status.conditions[0].last_transition_time.year == 2026
    assert jobs.get("rv-u1-1-1") is None
    assert kube.lists == []  # no LIST


def test_a_job_created_here_is_running_until_the_watch_brings_it():
    kube = Listing()
    ix._listed[("shop", "u1")] = time.monotonic()
    kube._created[("shop", "rv-u1-2-1")] = time.monotonic()  # as create_job records it
    indices = ix.Indices(manifests={}, jobs={})
    job = ix.jobs_of_run(indices, kube, "shop", "u1").get("rv-u1-2-1")
    assert job is not None and not job.status.conditions  # no condition: running
    seen = body("rv-u1-2-1", [])
    assert ix.jobs_of_run(ix.Indices({}, {("shop", "u1"): [seen]}), kube, "shop", "u1").get("rv-u1-2-1") is not None
    assert not kube.created_recently("shop", "rv-u1-2-1", 60)  # seen: a later deletion is seen as such
    assert ix.jobs_of_run(indices, kube, "shop", "u1").get("rv-u1-2-1") is None


def test_a_list_before_the_index_is_known():
    kube = Listing()
    assert ix.jobs_of_run(None, kube, "shop", "u1") == {}
    assert kube.lists == [("shop", "reversi.dev/run-uid=u1")]


def test_a_runs_jobs_are_listed_on_the_first_read_and_once_a_minute_after():
    kube = Listing()
    ix._listed.pop(("shop", "u2"), None)
    indices = ix.Indices(manifests={}, jobs={})
    ix.jobs_of_run(indices, kube, "shop", "u2")
    ix.jobs_of_run(indices, kube, "shop", "u2")
    assert kube.lists == [("shop", "reversi.dev/run-uid=u2")]  # the first read only
    ix._listed[("shop", "u2")] -= ix.RESYNC_SECONDS
    ix.jobs_of_run(indices, kube, "shop", "u2")
    assert len(kube.lists) == 2
