"""``kubectl reversi -o json|yaml|name|wide`` without a cluster: the pure rendering
(:mod:`reversi.cli.output` and the views' documents and wide tables), the refusal of an unknown
format, the deprecated ``--json``, and errors that stay one line (a missing optional extra, a bug)."""

from __future__ import annotations

import datetime as dt
import json
import sys
from types import SimpleNamespace

import pytest
import yaml

from reversi.cli import main as plugin
from reversi.cli import output, views
from reversi.engine import build_plan

from reversi_testkit import RUN_ID, example_run_spec
from tests.unit.test_plugin_cli import run, single_error

NOW = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=dt.UTC)




# ---------------------------------------------------------------------------- rendering


def test_yaml_of_a_plan_reads_back_equal_to_its_json():
    doc = views.plan_doc(build_plan(example_run_spec(), None, run_id=RUN_ID), run_id=RUN_ID)
    assert yaml.safe_load(output.dump(doc, "yaml")) == json.loads(output.dump(doc, "json")) == doc


def test_yaml_writes_what_json_would_print_as_text_and_keeps_key_order():
    doc = {"b": (1, 2), "a": NOW, "text": "ünïcode: yes"}
    text = output.dump(doc, "yaml")
    assert yaml.safe_load(text) == {"b": [1, 2], "a": str(NOW), "text": "ünïcode: yes"}
    assert text.index("b:") < text.index("a:")
    with pytest.raises(ValueError, match="not a document format"):
        output.dump(doc, "wide")


def test_name_is_kind_dot_group_slash_name_as_kubectl_prints_it():
    assert output.object_name("RollbackRequest", "undo-x") == "rollbackrequest.reversi.dev/undo-x"
    assert output.object_name("Pod", "p", group="") == "pod/p"
    assert output.names("Run", ["a", "b"]) == "run.reversi.dev/a\nrun.reversi.dev/b"
    assert output.list_of([{"kind": "Halt"}])["kind"] == "List"


def test_report_doc_of_a_dry_run_says_whether_it_is_fully_reversible_in_camel_case():
    request = {"metadata": {"name": "u", "namespace": "shop"}, "spec": {"runRef": {"name": "r"}, "dryRun": True},
               "status": {"phase": "Planned", "plan": {"fullyReversible": True}}}
    doc = views.report_doc(request)
    assert doc["dryRun"] is True and doc["fullyReversible"] is True and doc["complete"] is False
    assert doc["awaitingApproval"] == [] and doc["residue"] == []


def test_wide_plan_table_adds_the_undo_kind_runner_and_arguments_before_the_reason():
    plan = build_plan(example_run_spec(), None, run_id=RUN_ID)
    narrow, wide = views.plan_table(plan).splitlines(), views.plan_table(plan, wide=True).splitlines()
    assert "UNDO KIND" not in narrow[0]
    assert wide[0].split()[6:9] == ["UNDO", "KIND", "RUNNER"] and wide[0].endswith("REASON / BLOCKED BY")
    row1 = next(line for line in wide if line.startswith("1 "))
    assert '{"charge_id":"ch_o9","amount":700}' in row1 and "compensation" in row1


def _halt(name: str, conditions: list[dict]) -> dict:
    meta = {"name": name, "namespace": "shop", "creationTimestamp": "2025-01-02T03:00:05Z"}
    return {"kind": "Halt", "metadata": meta,
            "spec": {"reason": "incident"}, "status": {"active": True, "refusedCalls": 2, "conditions": conditions}}


def test_wide_halt_rows_show_in_force_and_every_condition():
    halts = [_halt("h", [{"type": "Active", "status": "True"}, {"type": "InForce", "status": "True"}]), _halt("g", [])]
    lines = views.halt_rows(halts, NOW, False, wide=True).splitlines()
    assert lines[0].split() == ["KIND", "NAME", "REASON", "SCOPE", "ACTIVE", "REFUSED", "BY", "IN-FORCE", "CONDITIONS",
                                "AGE"]
    assert "Active=True,InForce=True" in lines[1] and lines[1].split()[-3] == "True"
    assert lines[2].split()[-3:] == ["-", "-", "4m"]
    assert "IN-FORCE" not in views.halt_rows(halts, NOW, False)


def test_kill_switch_doc_off_and_on():
    assert views.kill_switch_doc(None) == {"on": False}
    on = {"metadata": {"creationTimestamp": "2025-01-02T03:00:00Z"}, "spec": {"reason": "r", "by": "ana"},
          "status": {"refusedCalls": 7}}
    assert views.kill_switch_doc(on) == {"on": True, "reason": "r", "by": "ana", "since": "2025-01-02T03:00:00Z",
                                         "refusedCalls": 7}


def _archived(**kw):
    base = {"uid": "u-1", "namespace": "shop", "name": "r", "principal": "p", "actor": None, "created_at": NOW,
            "last_activity": None, "archived_at": NOW, "steps": 3, "deleted_reason": "ttl", "writes": 2}
    return SimpleNamespace(**{**base, **kw})


def test_archive_doc_is_camel_case_with_rfc3339_times_and_wide_rows_add_writes():
    doc = views.archive_doc(_archived())
    assert doc == {"namespace": "shop", "name": "r", "uid": "u-1", "principal": "p", "actor": None, "steps": 3,
                   "writes": 2, "createdAt": "2025-01-02T03:04:05Z", "lastActivity": None,
                   "archivedAt": "2025-01-02T03:04:05Z", "deletedReason": "ttl"}
    assert "WRITES" in views.archive_rows([_archived()], NOW, False, wide=True).splitlines()[0]
    assert "WRITES" not in views.archive_rows([_archived()], NOW, False)


# -------------------------------------------------------------------------------- logs


def _job(name: str, step: int, attempt: int, request_uid: str, read: int | None = None, by: str = "undo-1") -> dict:
    labels = {"reversi.dev/step": str(step), "reversi.dev/attempt": str(attempt),
              "reversi.dev/request-uid": request_uid}
    if read is not None:
        labels["reversi.dev/read"] = str(read)
    return {"name": name, "labels": labels, "annotations": {"reversi.dev/request": by}}


def test_logs_shows_each_steps_last_job_of_this_request_else_the_runs_last():
    jobs = [_job("a1", 0, 1, "me"), _job("a2", 0, 2, "me"), _job("old3", 0, 3, "earlier", by="undo-0"),
            _job("b1", 1, 1, "earlier", by="undo-0"), _job("r1", 2, 1, "me", read=1), _job("r2", 2, 1, "me", read=2),
            {"name": "unlabelled", "labels": {}}]
    chosen = views.jobs_by_step(jobs, "me")
    assert {s: j["name"] for s, j in chosen.items()} == {0: "a2", 1: "b1", 2: "r2"}
    assert views.logs_heading(1, "payments.refund", chosen[1], "undo-1") == \
        "==> step 1 (payments.refund): Job b1, started by RollbackRequest undo-0 <=="
    assert views.logs_heading(0, None, chosen[0], "undo-1") == "==> step 0: Job a2 <=="


def test_logs_reads_the_newest_pod_of_the_job_by_the_job_controllers_label():
    pods = [{"name": "a2-old", "labels": {"job-name": "a2"}, "created": "2025-01-01T00:00:00"},
            {"name": "a2-new", "labels": {"batch.kubernetes.io/job-name": "a2"}, "created": "2025-01-02T00:00:00"},
            {"name": "other", "labels": {"job-name": "a1"}, "created": "2025-01-03T00:00:00"}]
    assert views.pod_of_job(pods, "a2")["name"] == "a2-new"
    assert views.pod_of_job(pods, "zz") is None


# ------------------------------------------------------------------------------ the CLI


@pytest.mark.parametrize("argv, allowed", [
    (("plan", "r", "-o", "xml"), "'json', 'yaml', 'name', 'wide'"),
    (("describe", "u", "--output", "table"), "'json', 'yaml', 'name', 'wide'"),
    (("version", "--client", "-o", "wide"), "'json', 'yaml'"),
    (("kill-switch", "status", "-o", "wide"), "'json', 'yaml', 'name'"),
    (("halt", "list", "-o", "jsonpath"), "'json', 'yaml', 'name', 'wide'"),
    (("archive", "list", "-o", "csv"), "'json', 'yaml', 'name', 'wide'"),
])
def test_an_unknown_format_is_one_line_naming_the_allowed_ones(capsys, argv, allowed):
    code, out, err = run(capsys, *argv)
    assert code == 1 and out == ""
    assert f"is not one of {allowed}" in single_error(err)


def test_every_command_that_prints_objects_or_reports_takes_o():
    for path in (["plan"], ["describe"], ["rollback"], ["halt", "list"], ["archive", "list"], ["archive", "show"],
                 ["version"], ["kill-switch", "status"]):
        command = plugin.cli
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        flags = {opt for p in command.params for opt in getattr(p, "opts", [])}
        assert {"-o", "--output"} <= flags, path


def test_version_json_alias_warns_and_prints_what_o_json_prints(capsys):
    code, out, err = run(capsys, "version", "--client", "--json")
    assert code == 0 and "deprecated; use -o json" in err and len(err.strip().splitlines()) == 1
    code2, out2, _ = run(capsys, "version", "--client", "-o", "json")
    assert code2 == 0 and out2 == out and set(json.loads(out)) == {"version", "schemaVersion"}
    code3, out3, _ = run(capsys, "version", "--client", "-o", "yaml")
    assert code3 == 0 and yaml.safe_load(out3) == json.loads(out)
    code4, _, err4 = run(capsys, "version", "--client", "--json", "-o", "yaml")
    assert code4 == 1 and "--json means -o json" in single_error(err4)


def test_rollback_o_json_needs_wait(capsys):
    code, _, err = run(capsys, "rollback", "r", "-o", "yaml")
    assert code == 1
    assert single_error(err) == "error: -o yaml needs --wait (the report is printed when the request ends)"


def test_archive_without_its_driver_is_one_line_naming_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an install without the archive extra has
    code, out, err = run(capsys, "archive", "list", "--dsn", "host=nowhere")
    assert code == 1 and out == ""
    line = single_error(err)
    assert "psycopg" in line and "pip install 'reversi[archive]'" in line


def test_a_module_missing_anywhere_names_its_extra_and_a_bug_is_one_line(capsys, monkeypatch):
    def broken(*_a, **_k):
        raise ModuleNotFoundError("No module named 'mcp'", name="mcp")

    monkeypatch.setattr(plugin.formats, "dump", broken)
    code, _, err = run(capsys, "version", "--client", "-o", "json")
    assert code == 1 and single_error(err) == \
        "error: this command needs mcp, which is not installed: pip install 'reversi[gateway]'"

    def bug(*_a, **_k):
        raise KeyError("spec")

    monkeypatch.setattr(plugin.formats, "dump", bug)
    code, _, err = run(capsys, "version", "--client", "-o", "json")
    assert code == 1 and "unexpected KeyError" in single_error(err) and "REVERSI_DEBUG=1" in err
    monkeypatch.setenv("REVERSI_DEBUG", "1")
    with pytest.raises(KeyError):
        plugin.main(["version", "--client", "-o", "json"])
