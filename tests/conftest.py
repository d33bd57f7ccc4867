"""Shared fixtures: the local control plane, once per test run, and a namespace per test.

The control plane is started by the first test that needs it and stopped at the end of the
run. Set ``REVERSI_REUSE_CLUSTER=1`` to reuse one that is already running (``reversi-devcluster
up``) and leave it running afterwards. When a test that used the cluster fails, the report
names the folder with every component's log.

Under pytest-xdist (``make test`` runs ``-n 2``) each worker has a control plane of its own:
worker ``gwN`` (N >= 1) uses the state folder ``<cluster dir>-gwN`` and every port of the
cluster, the test operator and the chart releases moved up by ``WORKER_PORT_STEP * N``
(pods share the host's network on the local control plane, so two releases must not share a
port). Worker ``gw0`` and a run without workers use the settings as they are.
"""

from __future__ import annotations

import os
import re
import uuid

import pytest
from hypothesis import settings as hypothesis_settings

from reversi_devcluster.cluster import Cluster, ClusterSettings

#: how far apart the ports of two pytest-xdist workers are
WORKER_PORT_STEP = 10
#: the ports a worker moves (environment variable, default): the cluster's, the test operator's
#: (tests/integration/conftest.py) and the chart releases' (tests/chart/chartkit.py). All lie
#: below the kernel's ephemeral range (net.ipv4.ip_local_port_range, 32768 and up): a test that
#: polls a port in that range before its server listens can connect to itself (TCP simultaneous
#: open) and hold the port the server then fails to bind
WORKER_PORTS = {
    "REVERSI_APISERVER_PORT": 16443, "REVERSI_ETCD_PORT": 12379, "REVERSI_ETCD_PEER_PORT": 12380,
    "REVERSI_KUBELET_PORT": 20250, "REVERSI_TEST_METRICS_PORT": 18089, "REVERSI_TEST_WEBHOOK_PORT": 19089,
    "REVERSI_TEST_CHART_METRICS_PORT": 28180, "REVERSI_TEST_CHART_WEBHOOK_PORT": 28443,
    "REVERSI_TEST_CHART_HEALTH_PORT": 28181,
}

#: The e2e tier (make e2e; docs/development.md#tests): the real node, every chart release and
#: upgrade, chaos, failover and live Prometheus. Every other test is in make test. Paths from the
#: repository's root.
E2E_MODULES = frozenset({
    "tests/e2e/test_real_node.py",
    "tests/chart/test_chart_cluster.py", "tests/chart/test_chart_upgrade.py", "tests/chart/test_chart_variants.py",
    "tests/integration/test_chaos.py", "tests/integration/test_failover_chaos.py",
    "tests/integration/test_leader_election.py", "tests/integration/test_prometheus_alerts.py",
    # faults injected at chosen moments (the tests that start control planes of their own stay in make
    # test: beside the real node they would slow its pods past the chart's timeouts)
    "tests/integration/test_fault_matrix_cells.py", "tests/integration/test_crash_and_scale.py",
    "tests/integration/test_webhook_stalls.py",
})


def pytest_collection_modifyitems(config, items):
    """Mark the e2e tier's tests ``e2e`` (make test deselects them with ``-m "not e2e"``)."""
    root = config.rootpath
    for item in items:
        if item.path.relative_to(root).as_posix() in E2E_MODULES:
            item.add_marker(pytest.mark.e2e)


# The properties judge results, not speed: on a loaded 2-core CI machine an example that takes more
# than Hypothesis' default 200 ms deadline is no failure of the rule it checks.
hypothesis_settings.register_profile("reversi", deadline=None)
hypothesis_settings.load_profile("reversi")


def _worker_environment(worker: str | None) -> dict[str, str]:
    """The environment a pytest-xdist worker named ``worker`` (``gw0``, ``gw1``, ...) runs with:
    for ``gwN`` with N >= 1 its own cluster folder and ports (see the module docstring); empty
    for ``gw0`` and outside xdist."""
    if not worker or not worker.startswith("gw") or not worker[2:].isdigit() or worker == "gw0":
        return {}
    n = int(worker[2:])
    env = {"REVERSI_CLUSTER_DIR": f"{ClusterSettings().cluster_dir}-{worker}"}
    for name, default in WORKER_PORTS.items():
        env[name] = str(int(os.environ.get(name) or default) + WORKER_PORT_STEP * n)
    return env


os.environ.update(_worker_environment(os.environ.get("PYTEST_XDIST_WORKER")))

_cluster_used = False


@pytest.fixture(scope="session")
def cluster():
    """The running local control plane (:class:`reversi_devcluster.cluster.Cluster`)."""
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
