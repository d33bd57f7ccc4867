"""Every example in docs/examples is accepted as written: each object is created with a server-side
dry run (the CRD schemas, their CEL rules, the admission policies and webhooks all judge it;
nothing is stored), in the test's namespace in place of the one it names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.dynamic import DynamicClient

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "docs" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_example_is_accepted_by_the_api_server_as_written(rv, path):
    dynamic = DynamicClient(rv.api)
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs, f"{path.name} holds no object"
    for obj in docs:
        resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        if resource.namespaced:
            obj["metadata"]["namespace"] = rv.ns
            resource.create(body=obj, namespace=rv.ns, dry_run="All")
        else:
            resource.create(body=obj, dry_run="All")
