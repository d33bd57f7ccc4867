"""Upgrading a release whose CRDs are older than the operator: docs/operations.md#upgrading,
followed word for word.

The old release is the chart as it was before its CRDs became templates: CRDs in its ``crds/``
folder (which Helm installs once and never upgrades), without a schema version, and the
RollbackRequest CRD without ``status.progress``. The operator of this checkout runs against them
and must refuse to reconcile (log, Event, metric, ``kubectl reversi version``), since the API
server prunes the fields it writes. After the documented commands, the field works, the rollback
that waited completes, and ``helm uninstall`` leaves the CRDs and the users' objects.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from reversi import crdgen
from reversi_devcluster.localop import apply_crds
from reversi.models import ALL_CRDS
from reversi.models.common import SCHEMA_VERSION
from tests.chart.chartkit import CHART, REPO, Release, release_values
from tests.helpers import wait_for
from tests.integration.conftest import RV, integration_operator_paused

pytestmark = pytest.mark.cluster


def _old_chart(tmp_path: Path) -> Path:
    """The chart before schema versions: CRDs in crds/ (no annotation, no status default),
    RollbackRequest without status.progress, no crds.* values."""
    old = tmp_path / "reversi"
    shutil.copytree(CHART, old)
    shutil.rmtree(old / "templates" / "crds")
    (old / "crds").mkdir(exist_ok=True)
    for info in ALL_CRDS:
        crd = crdgen.crd_for(info)
        del crd["metadata"]["annotations"]
        status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        status.pop("default", None)  # a record kind (RunStep) has none
        if info.kind == "RollbackRequest":
            del status["properties"]["progress"]
        (old / "crds" / f"{info.crd_name}.yaml").write_text(yaml.safe_dump(crd, sort_keys=False))
        (tmp_path / "old-crds").mkdir(exist_ok=True)
        shutil.copy(old / "crds" / f"{info.crd_name}.yaml", tmp_path / "old-crds")
    schema = json.loads((old / "values.schema.json").read_text())
    del schema["properties"]["crds"]
    (old / "values.schema.json").write_text(json.dumps(schema))
    values = (old / "values.yaml").read_text()
    (old / "values.yaml").write_text(re.sub(r"\ncrds:\n(  .*\n)+", "\n", values))
    return old


def _upgrade_commands() -> str:
    """The shell block of docs/operations.md, "Upgrading"."""
    doc = (REPO / "docs" / "operations.md").read_text()
    section = doc.split("\n## Upgrading\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```sh\n(.*?)```", section, flags=re.S).group(1)


def _metric(text: str, name: str) -> float | None:
    match = re.search(rf"^{name} (\S+)$", text, flags=re.M)
    return float(match.group(1)) if match else None


def test_upgrade_from_older_crds_as_documented(cluster, crds, helm, kubectl, admin_api, downstream, tmp_path):
    # the old CRDs and the release's operator: the integration tests' operator is stopped meanwhile
    with integration_operator_paused(admin_api):
        _upgrade_from_older_crds(cluster, helm, kubectl, admin_api, downstream, tmp_path)


def _upgrade_from_older_crds(cluster, helm, kubectl, admin_api, downstream, tmp_path) -> None:
    kc = cluster.paths.admin_kubeconfig
    old = _old_chart(tmp_path)
    # what the old chart's `helm install` did: create the CRDs of its crds/ folder
    apply_crds(admin_api, tmp_path / "old-crds")
    values = release_values()
    values.pop("crds")  # the old chart has no such values
    ns = f"reversi-system-{uuid.uuid4().hex[:5]}"
    rel = Release(helm, kubectl, kc, tmp_path, "rv", ns, values, chart=old)
    env = {**os.environ, "KUBECONFIG": str(kc), "RELEASE": rel.name, "NAMESPACE": ns,
           "PATH": os.pathsep.join([str(Path(kubectl).parent), str(Path(helm).parent), str(Path(sys.executable).parent),
                                    os.environ.get("PATH", "")])}
    version = lambda: subprocess.run(["kubectl", "reversi", "version"], env=env, capture_output=True,  # noqa: E731
                                     text=True, timeout=60)
    users_ns = f"upgrade-{uuid.uuid4().hex[:5]}"
    rel.kubectl_cmd("create", "namespace", users_ns)
    try:
        rel.install()
        # ---- the operator refuses to reconcile against the old CRDs
        wait_for(lambda: _metric(rel.metrics_text(), "reversi_crd_schema_outdated") == 1, timeout=30,
                 what="reversi_crd_schema_outdated to be 1")
        assert "refusing to reconcile" in rel.logs()
        events = json.loads(rel.kubectl_cmd("get", "events", "-n", "default", "-o", "json", "--field-selector",
                                            "reason=SchemaOutdated,involvedObject.name=rollbackrequests.reversi.dev").stdout)
        assert any(f"the operator needs {SCHEMA_VERSION}" in e["message"] for e in events["items"]), events
        before = version()
        assert before.returncode == 2, before.stdout + before.stderr
        assert re.search(r"rollbackrequests\.reversi\.dev +no schema version", before.stdout), before.stdout

        rv = RV(admin_api, users_ns, downstream)
        rv.apply_manifest()
        charge = rv.charge("o-upgrade")
        rv.run("r", [rv.step(0, "payments.create_charge", {"order_id": "o-upgrade", "amount": 700,
                                                           "customer": "cus_9"}, charge)], recorded=False)
        # a step recorded before runs pinned their manifest carries its own snapshot: it stays
        # readable after the upgrade and is undone by it (docs/concepts.md#the-journal)
        old_step = rv.steps("r")[0]["spec"]
        assert old_step["snapshot"]["name"] == "payments.create_charge" and "runAtOpen" not in old_step
        rv.request("undo", "r")
        # the old CRD lacks the field: the API server prunes it without a word
        rv.custom.patch_namespaced_custom_object_status("reversi.dev", "v1alpha1", users_ns, "rollbackrequests",
                                                         "undo", {"status": {"progress": "0/1"}})
        req = rv.get("rollbackrequests", "undo")
        assert "progress" not in (req.get("status") or {})
        assert "phase" not in (req.get("status") or {}), "the operator reconciled against old CRDs"
        assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is False

        pod_before = rel.pod()["metadata"]["uid"]
        # ---- follow docs/operations.md, "Upgrading" (new values get their defaults: crds.enabled)
        proc = subprocess.run(["bash", "-c", _upgrade_commands()], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"schema version {SCHEMA_VERSION}" in proc.stdout

        # ---- the CRDs are the release's now, kept on uninstall; the operator reconciles again
        crd = json.loads(rel.kubectl_cmd("get", "crd", "rollbackrequests.reversi.dev", "-o", "json").stdout)
        assert crd["metadata"]["annotations"]["reversi.dev/schema-version"] == str(SCHEMA_VERSION)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        wait_for(lambda: _metric(rel.metrics_text(), "reversi_crd_schema_outdated") == 0, timeout=30,
                 what="reversi_crd_schema_outdated to be 0")
        assert rel.pod()["metadata"]["uid"] == pod_before, "the operator noticed the CRDs only after a restart"
        assert "the CRDs were upgraded" in rel.logs()
        done = rv.wait_phase("undo", "Succeeded", "Incomplete", "Failed", timeout=120)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        assert done["status"]["progress"] == "1/1"  # the field works now
        assert rv.downstream.get(f"/payments/charges/{charge['id']}")["refunded"] is True
        assert rv.steps("r")[0]["spec"]["snapshot"] == old_step["snapshot"], "the old step keeps its snapshot"
        assert version().returncode == 0

        rel.uninstall()
        crd_left = rel.kubectl_cmd("get", "crd", "runs.reversi.dev", check=False)
        assert crd_left.returncode == 0, "helm uninstall deleted the CRDs"
        assert rv.get("runs", "r")["metadata"]["name"] == "r"
    finally:
        rel.uninstall(check=False)
        rel.kubectl_cmd("delete", "namespace", ns, users_ns, "--wait=false", check=False)
        apply_crds(admin_api)  # back to the CRDs of crds/, for the tests after this one
