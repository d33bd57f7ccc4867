"""The committed CRDs are generated from the models, structural, and complete
(docs/development.md#regenerating-the-crds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reversi import crdgen
from reversi.models import ALL_CRDS

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"


def _env():
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "operator") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_committed_crds_and_field_references_match_the_models():
    proc = subprocess.run(
        [sys.executable, "-m", "reversi.crdgen", "--check", "--out", str(CRD_DIR),
         "--chart-out", str(ROOT / "charts" / "reversi" / "templates" / "crds"),
         "--docs-out", str(ROOT / "docs" / "reference")],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr


def test_check_mode_fails_on_a_stale_chart_template(tmp_path):
    assert crdgen.main(["--out", str(tmp_path / "crds"), "--chart-out", str(tmp_path / "chart")]) == 0
    target = tmp_path / "chart" / "halts.reversi.dev.yaml"
    target.write_text(target.read_text().replace("helm.sh/resource-policy: keep", ""))
    assert crdgen.main(["--check", "--out", str(tmp_path / "crds"), "--chart-out", str(tmp_path / "chart")]) == 1


def test_check_mode_fails_on_a_stale_file(tmp_path):
    assert crdgen.main(["--out", str(tmp_path)]) == 0
    target = tmp_path / "runs.reversi.dev.yaml"
    target.write_text(target.read_text().replace("rvrun", "rr"))
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 1


def _crds():
    return {info.kind: yaml.safe_load((CRD_DIR / f"{info.crd_name}.yaml").read_text()) for info in ALL_CRDS}


def _walk(node, path="", ancestors_with_rules=False):
    yield path, node, ancestors_with_rules
    rules = ancestors_with_rules or bool(node.get("x-kubernetes-validations"))
    for key, child in (node.get("properties") or {}).items():
        yield from _walk(child, f"{path}.{key}", rules)
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]", rules)


def test_names_short_names_and_categories():
    crds = _crds()
    expected = {
        "ToolManifest": ("toolmanifests", ["tm"], "Namespaced"),
        "Run": ("runs", ["rvrun"], "Namespaced"),
        "RollbackRequest": ("rollbackrequests", ["rbr"], "Namespaced"),
        "Halt": ("halts", ["halt"], "Namespaced"),
        "ClusterHalt": ("clusterhalts", ["chalt"], "Cluster"),
    }
    for kind, (plural, short, scope) in expected.items():
        spec = crds[kind]["spec"]
        assert crds[kind]["metadata"]["name"] == f"{plural}.reversi.dev"
        assert spec["names"]["plural"] == plural and spec["names"]["shortNames"] == short
        assert spec["names"]["categories"] == ["reversi"]
        assert spec["scope"] == scope
        version = spec["versions"][0]
        assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
        assert version["subresources"] == {"status": {}}


def test_printer_columns():
    crds = _crds()
    columns = {kind: [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
               for kind, crd in crds.items()}
    assert columns["RollbackRequest"][:4] == ["Run", "Phase", "Progress", "Complete"]
    assert columns["Run"][:3] == ["Principal", "Mode", "Scope"]
    assert columns["RunStep"][:4] == ["Run", "Index", "Tool", "Outcome"]
    assert columns["Halt"][:3] == ["Reason", "Active", "Refused"]
    assert all(cols[-1] == "Age" for cols in columns.values())


@pytest.mark.parametrize("kind", [info.kind for info in ALL_CRDS])
def test_schema_is_structural_and_bounded_where_cel_looks(kind):
    schema = _crds()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node, under_rules in _walk(schema):
        for forbidden in ("anyOf", "oneOf", "allOf", "$ref", "title"):
            assert forbidden not in node, f"{kind}{path}: {forbidden}"
        if "additionalProperties" in node:  # a map: its values typed and bounded, its size too
            values = node["additionalProperties"]
            assert isinstance(values, dict) and values.get("type") and "properties" not in node, f"{kind}{path}"
            assert "maxProperties" in node and (values["type"] != "string" or "maxLength" in values), f"{kind}{path}"
        assert node.get("type") or node.get("x-kubernetes-preserve-unknown-fields"), f"{kind}{path}: no type"
        assert node.get("description") or path.count(".") <= 1 or path.endswith("[]"), f"{kind}{path}: no description"
        if under_rules and node.get("type") == "array":
            assert "maxItems" in node, f"{kind}{path}: list under a CEL rule without maxItems"
        if under_rules and node.get("type") == "string" and "format" not in node:
            assert "maxLength" in node, f"{kind}{path}: string under a CEL rule without maxLength"


def _field_paths(model, prefix=""):
    """Wire paths of every field of a pydantic model, recursing into nested models."""
    from typing import get_args

    from pydantic import BaseModel

    out = set()
    for name, field in model.model_fields.items():
        alias = field.alias or name
        path = f"{prefix}.{alias}"
        out.add(path)
        candidates = [field.annotation, *get_args(field.annotation)]
        for candidate in list(candidates):
            candidates.extend(get_args(candidate))
        for candidate in candidates:
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                sub = "[]" if "list" in str(field.annotation) else ""
                out |= _field_paths(candidate, path + sub)
    return out


def _schema_paths(node, prefix=""):
    out = set()
    for key, child in (node.get("properties") or {}).items():
        out.add(f"{prefix}.{key}")
        out |= _schema_paths(child, f"{prefix}.{key}")
    if "items" in node:
        out |= _schema_paths(node["items"], prefix + "[]")
    return out


@pytest.mark.parametrize("info", ALL_CRDS, ids=lambda i: i.kind)
def test_every_status_and_spec_field_is_in_the_schema(info):
    schema = _crds()[info.kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert _field_paths(info.status_model) <= _schema_paths(schema["status"])
    assert _field_paths(info.spec_model) <= _schema_paths(schema["spec"])


def test_free_json_is_preserved():
    schema = _crds()["Run"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    step = schema["properties"]["spec"]["properties"]["steps"]["items"]
    assert step["properties"]["args"]["x-kubernetes-preserve-unknown-fields"] is True
    assert step["properties"]["result"]["x-kubernetes-preserve-unknown-fields"] is True
    assert step["properties"]["result"]["nullable"] is True
    assert schema["properties"]["spec"]["properties"]["steps"]["x-kubernetes-list-map-keys"] == ["index"]
    assert schema["properties"]["spec"]["properties"]["steps"]["maxItems"] == 20000


def test_immutability_rules_are_present():
    crds = _crds()
    run_spec = crds["Run"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["rule"] for r in run_spec["x-kubernetes-validations"]]
    assert any("principal == oldSelf.principal" in r for r in rules)
    assert any("size(self.steps) >= size(oldSelf.steps)" in r for r in rules)
    assert run_spec["properties"]["mode"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    step_rules = [r["rule"] for r in run_spec["properties"]["steps"]["items"]["x-kubernetes-validations"]]
    assert "oldSelf.outcome == 'intended' || self.outcome == oldSelf.outcome" in step_rules
    snapshot_rules = [r["rule"] for r in run_spec["properties"]["snapshots"]["items"]["x-kubernetes-validations"]]
    assert snapshot_rules == ["self.effect != 'write' || has(self.compensation)",
                              "!has(self.compensation) || !has(self.compensation.precheck) || "
                              "!self.compensation.precheck || has(self.verification)", "self == oldSelf"]
    rbr = crds["RollbackRequest"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert rbr["properties"]["runRef"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    assert rbr["properties"]["dryRun"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
