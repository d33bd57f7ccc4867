"""The chart's Argo CD health checks (Lua, run with lupa as Argo CD runs them) and kstatus
(sigs.k8s.io/cli-utils) on objects captured from the local control plane in each phase
(tests/unit/fixtures/phases, written by tests/integration/test_gitops_status.py)."""

from __future__ import annotations

import json
import os
import re

import pytest
import yaml

from reversi.models import ALL_CRDS
from tests.gitops import (ARGOCD_SNIPPET, FIXTURES, HEALTH_KEY, REPO, argocd_health, health_checks, kstatus,
                          kstatus_binary)

PHASES = sorted(FIXTURES.glob("*.json"))


def _fixture(path):
    return json.loads(path.read_text())


def test_there_is_a_health_check_for_every_kind():
    assert sorted(health_checks()) == sorted(info.kind for info in ALL_CRDS if info.reconciled)


def test_fixtures_cover_every_kind_and_every_verdict():
    fixtures = [_fixture(p) for p in PHASES]
    assert {f["object"]["kind"] for f in fixtures} == {info.kind for info in ALL_CRDS if info.reconciled}
    assert {f["argocd"] for f in fixtures} == {"Healthy", "Progressing", "Degraded", "Suspended"}
    assert {f["kstatus"] for f in fixtures} == {"Current", "InProgress", "Failed"}


@pytest.mark.parametrize("path", PHASES, ids=lambda p: p.stem)
def test_argocd_health_of_each_captured_phase(path):
    fixture = _fixture(path)
    health = argocd_health(fixture["object"])
    assert health["status"] == fixture["argocd"], health
    assert health["message"], "Argo CD shows the message: it must say something"


def test_argocd_health_waits_for_the_latest_generation():
    fixture = _fixture(FIXTURES / "rollbackrequest-succeeded.json")
    obj = fixture["object"]
    obj["metadata"]["generation"] += 1  # a spec change the operator has not observed yet
    assert argocd_health(obj)["status"] == "Progressing"


@pytest.mark.skipif(not os.access(kstatus_binary(), os.X_OK),
                    reason="kstatus-check is not built (reversi-devcluster build --all; make test builds it)")
def test_kstatus_of_each_captured_phase():
    fixtures = [_fixture(p) for p in PHASES]
    verdicts = kstatus([f["object"] for f in fixtures])
    got = {p.stem: v["status"] for p, v in zip(PHASES, verdicts, strict=True)}
    assert got == {p.stem: f["kstatus"] for p, f in zip(PHASES, fixtures, strict=True)}


def test_operations_guide_shows_the_chart_snippet():
    """docs/operations.md carries the snippet the chart ships, word for word."""
    doc = (REPO / "docs" / "operations.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, flags=re.S)
    wanted = yaml.safe_load(ARGOCD_SNIPPET.read_text())["data"]
    shown = [yaml.safe_load(b) for b in blocks if HEALTH_KEY.format(kind="RollbackRequest") in b]
    assert shown, "no Argo CD health snippet in docs/operations.md"
    assert shown[0]["data"] == wanted
