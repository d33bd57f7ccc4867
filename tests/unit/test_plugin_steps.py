"""``kubectl reversi`` reads a run's RunSteps in one paged LIST by label and plans the journal
they make (with the inline journal of a Run of 0.1); describe lists them only when it must."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from reversi.cli import main as plugin
from reversi.cli.api import CliError

from reversi_testkit import snapshot, step, tool

CHARGE = snapshot(tool("pay.charge"))
READ = snapshot(tool("pay.get", "read"))


def runstep(spec: dict, undo: dict | None = None, run: str = "r") -> dict:
    """A RunStep as the API server returns it, managedFields and all."""
    obj = {"apiVersion": "reversi.dev/v1alpha1", "kind": "RunStep",
           "metadata": {"name": f"{run}-{spec['index']:05d}", "namespace": "shop", "labels": {"reversi.dev/run": run},
                        "managedFields": [{"manager": "sdk", "fieldsV1": {"f:spec": {"f:args": {}}}}]},
           "spec": {**spec, "runRef": {"name": run}}}
    if undo:
        obj["status"] = {"undo": undo}
    return obj


def page(items: list[dict], token: str | None = None) -> bytes:
    meta = {"resourceVersion": "42", **({"continue": token} if token else {})}
    body = {"apiVersion": "reversi.dev/v1alpha1", "items": items, "kind": "RunStepList", "metadata": meta}
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


UNDO = {"step": 1, "state": "compensated", "attempts": 1, "idempotencyKey": "a" * 64, "verification": "verified"}
ITEMS = [runstep(step(0, READ)), runstep(step(1, CHARGE), UNDO),
         runstep({**step(2, CHARGE, "uncertain"), "resolution": {"status": "succeeded", "result": {"id": "x"},
                                                                 "note": "seen", "actor": "alice"}})]


class FakeCustom:
    """A CustomObjectsApi that answers a LIST of RunSteps by label, two items a page."""

    def __init__(self, items: list[dict]):
        self.items = items
        self.calls: list[dict] = []

    def list_namespaced_custom_object(self, group, version, namespace, plural, **kwargs):
        self.calls.append({"plural": plural, **kwargs})
        assert plural == "runsteps" and kwargs["label_selector"] == "reversi.dev/run=r"
        start = int(kwargs.get("_continue") or 0)
        more = start + 2 < len(self.items)
        return SimpleNamespace(data=page(self.items[start:start + 2], str(start + 2) if more else None))


class FakeConnection:
    """What ``journal_of`` and ``plan_of`` use of a Connection."""

    namespace = "shop"

    def __init__(self, items: list[dict]):
        self.custom = FakeCustom(items)

    def steps_error(self, err, namespace, run):
        return CliError(f"steps of {namespace}/{run}: {err.status}")


RUN = {"metadata": {"name": "r", "namespace": "shop", "uid": "3f6c1a52-0000-4000-8000-000000004711"},
       "spec": {"mode": "enforce", "manifestRef": {"name": "m"}}}


def test_plan_of_a_run_reads_its_runsteps_resolutions_and_undo_state():
    c = FakeConnection(ITEMS)
    plan = plugin.plan_of(c, RUN)
    assert len(c.custom.calls) == 2, "one paged LIST by the run's label, never a GET per step"
    assert [(a.step, a.kind) for a in plan.actions] == [(0, "skip"), (1, "skip"), (2, "compensate")]
    assert "already compensated" in plan.actions[1].reason
    assert plan.actions[2].args == {"id": "x"}  # the resolution's result


def test_plan_of_a_run_of_0_1_not_moved_yet_reads_its_inline_journal():
    inline = {**RUN, "spec": {**RUN["spec"], "steps": [step(0, READ), step(1, CHARGE)]}}
    plan = plugin.plan_of(FakeConnection([]), inline)
    assert [(a.step, a.kind) for a in plan.actions] == [(0, "skip"), (1, "compensate")]


def test_a_gap_in_the_runsteps_is_an_error_naming_how_to_list_them():
    with pytest.raises(CliError) as err:
        plugin.plan_of(FakeConnection([ITEMS[0], ITEMS[2]]), RUN)
    assert "step(s) 1 are missing" in str(err.value)
    assert "kubectl get runsteps -l reversi.dev/run=r -n shop" in str(err.value)


def test_an_invalid_runstep_is_named_with_its_field():
    bad = runstep(step(1, CHARGE))
    bad["spec"]["outcome"] = "maybe"
    with pytest.raises(CliError) as err:
        plugin.plan_of(FakeConnection([ITEMS[0], bad]), RUN)
    assert str(err.value).startswith("RunStep r-00001 is invalid: outcome:")


class DescribeConnection:
    """What ``describe_view`` uses: the Run, its RunSteps (one LIST) and Events."""

    namespace = "shop"

    def __init__(self):
        self.listed = 0

    def get(self, plural: str, name: str) -> dict:
        assert (plural, name) == ("runs", "r")
        return RUN

    def run_steps(self, run: str) -> list[dict]:
        self.listed += 1
        return ITEMS

    def events_for(self, namespace: str, kind: str, uids: set[str]) -> list[dict]:
        return []


def test_describe_reads_the_runsteps_only_for_tools_the_status_does_not_name():
    request = {"metadata": {"name": "undo", "namespace": "shop", "uid": "u"}, "spec": {"runRef": {"name": "r"}},
               "status": {"phase": "Incomplete", "report": {"unresolved": [2], "compensated": [1], "complete": False},
                          "plan": {"actions": [{"step": 1, "tool": "pay.charge", "kind": "compensate"}],
                                   "omitted": 2}}}
    c = DescribeConnection()
    text = plugin.describe_view(c, request)
    assert c.listed == 1 and "step 2  pay.charge" in text and "step 1  pay.charge" in text
    request["status"]["report"]["unresolved"] = []
    plugin.describe_view(c, request)
    assert c.listed == 1, "every step shown is named by the status: no LIST"


def test_runsteps_unknown_to_the_server_say_the_crds_are_older_than_the_plugin():
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from reversi.cli.api import Connection

    c = Connection(client.ApiClient(), "shop", None, "https://example")
    err = c.steps_error(ApiException(status=404, reason="Not Found"), "shop", "r")
    assert str(err).startswith("listing the RunSteps of Run shop/r: the server does not know runsteps.reversi.dev")
    assert "kubectl apply -f crds/" in str(err)
