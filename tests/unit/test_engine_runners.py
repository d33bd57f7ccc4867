"""The runner record of a RollbackRequest (docs/concepts.md#runners-are-recorded-at-the-lock):
which runners a request records at its lock, that they are copied as the ToolManifest gives them
(references stay references), and that planning and Job building from the record decide exactly
what the live manifest decided."""

from __future__ import annotations

import itertools

import pytest

from reversi.adapters import jobs
from reversi.engine import executor as ex
from reversi.engine import runners as rs
from reversi.engine.plan import build_plan
from reversi.models.run import StepUndo
from reversi.models.toolmanifest import ToolManifestSpec
from tests.unit.reversi_testkit import RUN_ID, run_spec, snapshot, step, tool

SECRET_ENV = {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": "payments-api", "key": "token"}}}


def _runner(name: str, **extra) -> dict:
    return {"name": name, "image": f"registry.example/{name}:1", "command": [f"{name}-tool"], **extra}


def _manifest(*runners: dict, tools: list[dict] | None = None) -> ToolManifestSpec:
    return ToolManifestSpec.model_validate({"runners": list(runners), "tools": tools or []})


def _needs(plan, spec, manifest, prior=()):
    live = {r.name: r for r in manifest.runners}
    readers = {t.verification.tool: t.verification.runner for t in manifest.tools
               if t.verification is not None and t.verification.runner in live}
    return rs.runners_needed(plan, spec, prior, live, readers), live, readers


def test_records_only_the_runners_the_plan_needs_as_the_manifest_gives_them():
    cli = _runner("cli", args=["--live"], env=[{"name": "MODE", "value": "live"}, SECRET_ENV],
                  envFrom=[{"secretRef": {"name": "payments-api"}}, {"configMapRef": {"name": "payments-cfg"}}],
                  serviceAccountName="payments-undo", resources={"limits": {"cpu": "100m"}}, deadlineSeconds=90)
    entry = tool("a")
    entry["verification"]["runner"] = "reader"
    manifest = _manifest(cli, _runner("reader"), _runner("unused"), tools=[entry])
    spec = run_spec([step(0, snapshot(entry))])
    plan = build_plan(spec, run_id=RUN_ID)
    needs, live, _ = _needs(plan, spec, manifest)
    assert needs.names == {"cli", "reader"}
    entries = rs.record(live, needs)
    assert [e["name"] for e in entries] == ["cli", "reader"]
    recorded_cli = entries[0]
    # every field the Job builder uses, as written in the manifest; references stay references
    assert recorded_cli == {**cli, "readBackTools": []}
    assert recorded_cli["env"][1] == SECRET_ENV and "token" not in str(recorded_cli["envFrom"])


def test_nothing_to_compensate_records_an_empty_list_not_nothing():
    manifest = _manifest(_runner("cli"), tools=[tool("r", "read")])
    spec = run_spec([step(0, snapshot(tool("r", "read")))])
    needs, live, _ = _needs(build_plan(spec, run_id=RUN_ID), spec, manifest)
    entries = rs.record(live, needs)
    assert entries == [] and rs.from_record(entries) == ({}, {})
    assert rs.from_record(None) is None  # before the lock, or a dry run: nothing recorded yet


def test_a_reader_the_manifest_gives_since_is_recorded_with_its_read_back_tool():
    """The step's snapshot names reader runner ``old-reader``, gone from the manifest; the manifest
    now reads ``get-a`` with ``new-reader``: that one is recorded, for that tool."""
    old = tool("a")
    old["verification"]["runner"] = "old-reader"
    now = tool("a")
    now["verification"]["runner"] = "new-reader"
    manifest = _manifest(_runner("cli"), _runner("new-reader"), tools=[now])
    spec = run_spec([step(0, snapshot(old))])
    plan = build_plan(spec, run_id=RUN_ID)
    needs, live, _readers = _needs(plan, spec, manifest)
    assert needs.names == {"cli", "new-reader"} and dict(needs.read_back) == {"get-a": "new-reader"}
    entries = rs.record(live, needs)
    assert next(e for e in entries if e["name"] == "new-reader")["readBackTools"] == ["get-a"]
    runners, recorded_readers = rs.from_record(entries)
    vp = ex.verify_plan(spec.snapshot_of(spec.steps[0]), {}, {"id": "r0"}, set(runners), recorded_readers)
    assert vp.mode == "reader" and vp.runner == "new-reader"


def test_reverify_candidates_bring_their_reader_runner():
    """A step an earlier request left compensated but unverified is re-verified: its reader runner
    is recorded although no compensate action needs it; a step already verified brings none."""
    entry = tool("a")
    entry["verification"]["runner"] = "reader"
    manifest = _manifest(_runner("cli"), _runner("reader"), tools=[entry])
    spec = run_spec([step(0, snapshot(entry))])
    key = "0" * 64
    unverified = StepUndo(step=0, state="compensated", verification="unverified", idempotency_key=key, request="first")
    plan = build_plan(spec, [unverified], run_id=RUN_ID)
    assert plan.action(0).kind == "skip"
    needs, _, _ = _needs(plan, spec, manifest, [unverified])
    assert needs.names == {"reader"}
    verified = unverified.model_copy(update={"verification": "verified"})
    assert _needs(build_plan(spec, [verified], run_id=RUN_ID), spec, manifest, [verified])[0].names == set()


@pytest.mark.parametrize("declared, defined, fallback", list(itertools.product(
    [None, "reader", "gone"], [(), ("reader",), ("other",), ("reader", "other")], [False, True])))
def test_planning_from_the_record_decides_what_the_live_manifest_decided(declared, defined, fallback):
    """For every mix of declared reader runner, runners defined now and a reader the manifest gives
    the read-back tool elsewhere: the verify plan and the plan's ``verified`` from the record equal
    the live ones."""
    snap_entry = tool("a", reader=declared is not None)
    if declared:
        snap_entry["verification"]["runner"] = declared
    live_entry = tool("a", reader=False)
    tools = [live_entry]
    if fallback and "other" in defined:
        tools = [tool("a", reader=False), {**tool("b"), "verification": {**tool("b")["verification"], "tool": "get-a",
                                                                        "runner": "other"}}]
        tools[0]["name"] = "a"
    manifest = _manifest(_runner("cli"), *[_runner(n) for n in defined], tools=tools)
    spec = run_spec([step(0, snapshot(snap_entry))])
    live = {r.name: r for r in manifest.runners}
    readers = {t.verification.tool: t.verification.runner for t in manifest.tools
               if t.verification is not None and t.verification.runner in live}
    plan = build_plan(spec, run_id=RUN_ID, runner_names=live, readers=readers)
    runners, recorded_readers = rs.from_record(rs.record(live, rs.runners_needed(plan, spec, [], live, readers)))
    snap = spec.snapshot_of(spec.steps[0])
    assert ex.verify_plan(snap, {}, {"id": "r0"}, set(runners), recorded_readers) == \
        ex.verify_plan(snap, {}, {"id": "r0"}, set(live), readers)
    replanned = build_plan(spec, run_id=RUN_ID, runner_names=runners, readers=recorded_readers)
    assert replanned.action(0).verified == plan.action(0).verified
    assert set(runners) <= set(live) and "cli" in runners


def test_a_job_built_from_the_record_is_the_job_built_from_the_manifest():
    cli = _runner("cli", env=[{"name": "MODE", "value": "live"}, SECRET_ENV], deadlineSeconds=90,
                  envFrom=[{"secretRef": {"name": "payments-api"}}])
    manifest = _manifest(cli, tools=[tool("a", reader=False)])
    spec = run_spec([step(0, snapshot(tool("a", reader=False)))])
    needs, live, _ = _needs(build_plan(spec, run_id=RUN_ID), spec, manifest)
    runners, _ = rs.from_record(rs.record(live, needs))
    common = dict(owner=jobs.Owner("shop", "undo", "uid-1"), run_name="r", run_uid="run-uid", step=0, attempt=1,
                  call=jobs.reader_call("get-a", {}), role="reader")
    assert jobs.build_job(runner=runners["cli"], **common) == jobs.build_job(runner=live["cli"], **common)


def test_record_size_counts_the_json_so_a_huge_runner_can_be_refused():
    big = _runner("cli", args=["x" * 4096] * 100)
    manifest = _manifest(big, tools=[tool("a", reader=False)])
    spec = run_spec([step(0, snapshot(tool("a", reader=False)))])
    needs, live, _ = _needs(build_plan(spec, run_id=RUN_ID), spec, manifest)
    assert rs.record_size(rs.record(live, needs)) > rs.RECORD_LIMIT_BYTES
    small = _manifest(_runner("cli"), tools=[tool("a", reader=False)])
    assert rs.record_size(rs.record({r.name: r for r in small.runners}, needs)) < 1024


def test_describe_names_the_recorded_runners_in_one_line():
    import datetime as dt

    from reversi.cli import views

    request = {"metadata": {"name": "undo", "namespace": "shop"}, "spec": {"runRef": {"name": "r"}},
               "status": {"phase": "Running", "runners": [{**_runner("cli"), "readBackTools": []}]}}
    now = dt.datetime.now(dt.UTC)
    text = views.describe_request(request, None, [], now)
    assert "Runners:      cli (registry.example/cli:1), as recorded at the lock (status.runners)" in text
    del request["status"]["runners"]
    assert "Runners:" not in views.describe_request(request, None, [], now)
