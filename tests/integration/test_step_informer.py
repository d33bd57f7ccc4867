"""The per-run RunStep informer (reversi.adapters.stepwatch) against the real API server: it
lists a run's steps once, follows creates, status writes, resolutions and deletes from its watch,
sees only its own run, and stops when no one reads it."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from reversi.adapters import stepwatch
from reversi.adapters.journal import list_objects_and_version, step_body
from reversi.adapters.stepwatch import RunJournals
from reversi.models.runstep import step_name

from tests.helpers import wait_for

G, V = "reversi.dev", "v1alpha1"
pytestmark = pytest.mark.cluster


def _steps(rv, run: str, indexes: range, uncertain: tuple[int, ...] = ()) -> None:
    for i in indexes:
        outcome = "uncertain" if i in uncertain else "succeeded"
        rv.create("runsteps", step_body(rv.ns, run, rv.step(i, "payments.get_customer", {"id": f"c{i}"},
                                                            None if i in uncertain else {"id": "x"}, outcome)))


def test_the_informer_lists_a_run_once_then_follows_it_from_the_watch(rv):
    rv.apply_manifest()
    rv.run("watched", [])
    rv.run("other", [])
    _steps(rv, "watched", range(3), uncertain=(1,))
    _steps(rv, "other", range(2))
    journals = RunJournals(client.CustomObjectsApi(rv.api), idle_seconds=60, watch_seconds=5)
    try:
        first = journals.entries(rv.ns, "watched", wait=30)
        assert first is not None and sorted(first) == [0, 1, 2], "the first read waits for the LIST"
        assert journals.watching() == [(rv.ns, "watched")], "only the run that was read is watched"
        before = journals.versioned_entries(rv.ns, "watched")
        assert before is not None and before[1] == first
        assert journals.versioned_entries(rv.ns, "watched")[0] == before[0], "no event: the same version"

        _steps(rv, "watched", range(3, 5))  # new steps
        rv.resolve("watched", 1, status="failed", note="the lookup never happened")  # a resolution
        rv.custom.patch_namespaced_custom_object_status(  # an undo state write
            G, V, rv.ns, "runsteps", step_name("watched", 2),
            {"status": {"undo": {"step": 2, "state": "compensated", "attempts": 1, "idempotencyKey": "0" * 64}}})

        def caught_up():
            now = journals.entries(rv.ns, "watched")
            if now is None or sorted(now) != [0, 1, 2, 3, 4]:
                return None
            if now[1].spec.resolution is None or now[2].undo is None:
                return None
            return now

        now = wait_for(caught_up, timeout=30, what="the informer to see the new steps, the resolution and the undo")
        after = journals.versioned_entries(rv.ns, "watched")
        assert after is not None and after[0] > before[0], "every watch event bumps the journal's version"
        assert now[1].spec.resolution.status == "failed"
        assert now[2].undo.state == "compensated"
        assert all(e.spec.run_ref.name == "watched" for e in now.values()), "steps of other runs never enter"
    finally:
        journals.stop_all()


def test_an_unread_informer_stops_and_a_later_read_lists_again(rv):
    rv.apply_manifest()
    rv.run("brief", [])
    _steps(rv, "brief", range(2))
    journals = RunJournals(client.CustomObjectsApi(rv.api), idle_seconds=1, watch_seconds=2)
    try:
        assert sorted(journals.entries(rv.ns, "brief", wait=30) or {}) == [0, 1]
        wait_for(lambda: journals.watching() == [], timeout=30, what="the idle informer to stop")
        _steps(rv, "brief", range(2, 3))  # recorded while nobody watched
        again = journals.entries(rv.ns, "brief", wait=30)
        assert again is not None and sorted(again) == [0, 1, 2], "a new read lists the run again"
    finally:
        journals.stop_all()


class _CountingJournals(RunJournals):
    """The informer, counting its LISTs (the API calls are the real ones)."""

    lists = 0

    def _list(self, inf, members):
        self.lists += 1
        return super()._list(inf, members)


def test_a_watch_the_api_server_has_expired_lists_again(rv, cluster):
    """410 Gone: kube-apiserver restarted, so its watch cache begins after the version the
    informer last saw; a WATCH from that version is refused as too old, and the informer lists
    the run again instead of losing events."""
    rv.apply_manifest()
    rv.run("kept", [])
    _steps(rv, "kept", range(2))
    custom = client.CustomObjectsApi(rv.api)
    journals = _CountingJournals(custom, idle_seconds=120, watch_seconds=5)
    try:
        assert sorted(journals.entries(rv.ns, "kept", wait=30) or {}) == [0, 1]
        assert journals.lists == 1
        _, seen = list_objects_and_version(custom, rv.ns, "kept")
        rv.run("later", [])  # the store moves past the version the informer has seen
        cluster.restart(["kube-apiserver"], log=lambda *_: None)
        probe = stepwatch._Informer(rv.ns)
        with pytest.raises(stepwatch._Expired):  # the server's answer to a WATCH from that version
            journals._watch(probe, {"kept": stepwatch._RunWatch(rv.ns, "kept")}, seen)
        _steps(rv, "kept", range(2, 4))  # recorded after the restart
        wait_for(lambda: sorted(journals.entries(rv.ns, "kept") or {}) == [0, 1, 2, 3], timeout=60,
                 what="the informer to list again and follow the run after the restart")
        assert journals.lists >= 2, "the informer listed again"
    finally:
        journals.stop_all()


def test_runs_of_a_namespace_share_one_watch_and_a_joining_run_is_listed_at_once(rv):
    """Threads grow with namespaces, not runs (P5 of benchmarks/rollback_bench.py): the second run joins the first run's
    informer, whose WATCH (30 s server timeout, no events) is interrupted so the new run is listed
    at once; both runs then follow their own events only."""
    rv.apply_manifest()
    for run in ("one", "two", "three"):
        rv.run(run, [])
        _steps(rv, run, range(2))
    journals = RunJournals(client.CustomObjectsApi(rv.api), idle_seconds=60, watch_seconds=30)
    try:
        assert sorted(journals.entries(rv.ns, "one", wait=30) or {}) == [0, 1]
        wait_for(lambda: journals._informers and journals._informers[0].stream is not None, timeout=10,
                 what="the first run's WATCH to start")
        for run in ("two", "three"):
            began = time.monotonic()
            joined = journals.entries(rv.ns, run, wait=30)
            assert joined is not None and sorted(joined) == [0, 1]
            assert time.monotonic() - began < 10, "a joining run waited for the WATCH's timeout"
        assert journals.informers() == 1, "runs of one namespace share one informer"
        assert journals.watching() == [(rv.ns, "one"), (rv.ns, "three"), (rv.ns, "two")]
        _steps(rv, "two", range(2, 4))
        wait_for(lambda: sorted(journals.entries(rv.ns, "two") or {}) == [0, 1, 2, 3], timeout=30,
                 what="the shared watch to bring run two's new steps")
        assert sorted(journals.entries(rv.ns, "one") or {}) == [0, 1]
        assert sorted(journals.entries(rv.ns, "three") or {}) == [0, 1]
    finally:
        journals.stop_all()
