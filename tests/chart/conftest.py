"""Fixtures for the Helm chart's tests: the helm, promtool and kubectl binaries, rendering, and a
release of the chart installed on the local control plane with the operator running as a pod.

The binaries are the pinned builds in the cache (``reversi-devcluster build --all``; ``make
test`` builds them). On the local control plane the node agent ignores images and runs the
container's ``command`` (``reversi-operator``) with this machine's PATH, so the installed chart
runs the operator of this checkout, with the chart's ServiceAccount, RBAC, Secret and env.

On the local control plane pods share the host's network: the operator's ports are host ports,
so the tests use ports that do not clash (``REVERSI_TEST_CHART_METRICS_PORT``, default 28180;
``REVERSI_TEST_CHART_WEBHOOK_PORT``, default 28443); the pod's IP is the host's non-loopback
address, so the Service's EndpointSlice reaches it and the API server calls the webhooks through
the Service, as on a real cluster.

The release is installed once per module and uninstalled at its end; while it is installed the
integration tests' ``operator`` process is stopped, when the worker runs it (``make e2e``'s
workers take test files in any order), so that no request is worked by two operators.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import pytest

from reversi_devcluster.build import binary
from tests.chart.chartkit import Release, Renderer, release_values
from tests.integration.conftest import crds, downstream  # noqa: F401 - fixtures used by the chart tests
from tests.integration.conftest import integration_operator_paused


def _tool(component: str, name: str) -> Path:
    path = binary(component, name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} is not built ({path}); run `reversi-devcluster build --all` (make test does)")
    return path


@pytest.fixture(scope="session")
def helm() -> Path:
    return _tool("helm", "helm")


@pytest.fixture(scope="session")
def promtool() -> Path:
    return _tool("prometheus", "promtool")


@pytest.fixture(scope="session")
def kubectl() -> Path:
    return _tool("kubernetes", "kubectl")


@pytest.fixture
def render(helm, tmp_path) -> Renderer:
    return Renderer(helm, tmp_path)


@pytest.fixture(scope="module")
def installed(cluster, crds, helm, kubectl, tmp_path_factory, admin_api):  # noqa: F811 - crds is the imported fixture
    """``with installed(**values) as release:`` installs the chart (test values plus ``values``)
    as release ``rv`` in a namespace of its own, and uninstalls it afterwards. One at a time: the
    operator's ports are host ports on the local control plane."""

    @contextlib.contextmanager
    def install(**overrides):
        ns = f"reversi-system-{uuid.uuid4().hex[:5]}"
        rel = Release(helm, kubectl, cluster.paths.admin_kubeconfig, tmp_path_factory.mktemp("release"), "rv", ns,
                      release_values(**overrides))
        with integration_operator_paused(admin_api):
            try:
                rel.install()
            except BaseException:
                try:
                    print(f"--- operator log ---\n{rel.logs()[-6000:]}")
                except Exception:  # noqa: BLE001 - best effort for the report
                    pass
                rel.uninstall(check=False)
                raise
            try:
                yield rel
            finally:
                rel.uninstall()
                rel.kubectl_cmd("delete", "namespace", ns, "--wait=false", check=False)

    return install


@pytest.fixture(scope="module")
def release(installed):
    """The chart installed with the test values (see :func:`installed`) for one module."""
    with installed() as rel:
        yield rel
