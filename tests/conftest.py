"""Shared fixtures: the local control plane, once per test run, and a namespace per test.

The control plane is started by the first test that needs it and stopped at the end of the
run. Set ``REVERSI_REUSE_CLUSTER=1`` to reuse one that is already running (``reversi-devcluster
up``) and leave it running afterwards. When a test that used the cluster fails, the report
names the folder with every component's log.
"""

from __future__ import annotations

import os
import re
import uuid

import pytest

from reversi.devcluster.cluster import Cluster

_cluster_used = False


@pytest.fixture(scope="session")
def cluster():
    """The running local control plane (:class:`reversi.devcluster.cluster.Cluster`)."""
    global _cluster_used
    _cluster_used = True
    c = Cluster()
    reuse = os.environ.get("REVERSI_REUSE_CLUSTER") == "1" and c.is_running()
    if not reuse:
        c.up()
    os.environ["KUBECONFIG"] = str(c.paths.admin_kubeconfig)
    yield c
    if not reuse:
        c.down()


@pytest.fixture(scope="session")
def admin_api(cluster):
    """A kubernetes ``ApiClient`` authenticated as the cluster admin."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(cluster.paths.admin_kubeconfig))


@pytest.fixture
def namespace(request, cluster, admin_api):
    """A fresh namespace for one test, deleted afterwards."""
    from kubernetes import client

    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    core = client.CoreV1Api(admin_api)
    core.create_namespace({"metadata": {"name": name, "labels": {"reversi.dev/test": "true"}}})
    yield name
    core.delete_namespace(name, propagation_policy="Background")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and "cluster" in getattr(item, "fixturenames", ()):
        logs = Cluster().paths.logs
        report.sections.append(("control plane logs", f"component logs are in {logs}/"))
