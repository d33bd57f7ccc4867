"""The chart's API Priority and Fairness objects on the real API server
(docs/operations.md#api-priority-and-fairness): exactly what ``helm template`` renders is accepted,
and the API server classifies each ServiceAccount's requests as intended, which it says in every
answer's headers ``X-Kubernetes-PF-FlowSchema-UID`` and ``X-Kubernetes-PF-PriorityLevel-UID``:

- the operator's ServiceAccount: the level ``<fullname>-operator``; its Lease requests the built-in
  ``leader-election``;
- the admission replicas' ServiceAccount: ``<fullname>-operator`` too;
- any other ServiceAccount (an agent's): the built-in ``service-accounts`` schema, as before.

The local control plane's admin is exempt from APF (group system:masters), so each request is made
with a ServiceAccount token (TokenRequest). APF classifies a request before authorization, so a
request the ServiceAccount may not make is classified all the same.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from reversi_devcluster.build import binary
from tests.helpers import wait_for

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
FLOW_SCHEMA_UID = "X-Kubernetes-PF-FlowSchema-UID"
PRIORITY_LEVEL_UID = "X-Kubernetes-PF-PriorityLevel-UID"
TIMEOUT = 10


def _rendered(release: str, namespace: str) -> list[dict]:
    """The chart's flowcontrol objects, as ``helm template`` renders them for ``release`` in ``namespace``."""
    helm = binary("helm", "helm")
    if not os.access(helm, os.X_OK):
        pytest.fail(f"helm is not built ({helm}); run `reversi-devcluster build --all` (make test does)")
    out = subprocess.run([helm, "template", release, REPO / "charts" / "reversi", "--namespace", namespace,
                          "--kube-version", "1.36.3", "-s", "templates/flowcontrol.yaml"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    return [o for o in yaml.safe_load_all(out) if o]


@pytest.fixture
def chart_flowcontrol(admin_api, namespace) -> Iterator[dict[str, dict]]:
    """The chart's PriorityLevelConfiguration and FlowSchemas of a release named for this test in
    ``namespace``, created (they are cluster-scoped: deleted afterwards); by name, as stored."""
    release = f"apf-{uuid.uuid4().hex[:5]}"
    flow = client.FlowcontrolApiserverV1Api(admin_api)
    objs = _rendered(release, namespace)
    # the server accepts exactly what the chart renders (a dry run first: nothing is left when it refuses)
    for dry_run in ("All", None):
        stored = {}
        for obj in sorted(objs, key=lambda o: o["kind"] != "PriorityLevelConfiguration"):
            create = (flow.create_priority_level_configuration if obj["kind"] == "PriorityLevelConfiguration"
                      else flow.create_flow_schema)
            stored[obj["metadata"]["name"] + "/" + obj["kind"]] = create(
                obj, dry_run=dry_run, _request_timeout=TIMEOUT).to_dict()
    try:
        yield {"release": release, **stored}
    finally:
        for key in stored:
            name, kind = key.split("/")
            delete = (flow.delete_priority_level_configuration if kind == "PriorityLevelConfiguration"
                      else flow.delete_flow_schema)
            delete(name, _request_timeout=TIMEOUT)


def _token(admin_api: client.ApiClient, namespace: str, name: str) -> str:
    core = client.CoreV1Api(admin_api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}}, _request_timeout=TIMEOUT)
    review = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 600}}, _request_timeout=TIMEOUT)
    return review.status.token


def _classified(admin_api: client.ApiClient, token: str, path: str) -> tuple[str, str]:
    """(FlowSchema UID, PriorityLevelConfiguration UID) the API server answers a GET of ``path``
    made with ``token`` with, whether the request is allowed or not."""
    cfg = client.Configuration()  # the admin's host and CA, not its client certificate
    cfg.host, cfg.ssl_ca_cert = admin_api.configuration.host, admin_api.configuration.ssl_ca_cert
    with client.ApiClient(cfg) as api:
        # the bare request: an answer of any status, forbidden included (authorization comes after APF)
        answer = api.rest_client.request("GET", cfg.host + path, _request_timeout=TIMEOUT,
                                         headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        assert answer.status in (200, 403, 404), (path, answer.status, answer.read()[:300])
        headers = answer.getheaders()
    return headers.get(FLOW_SCHEMA_UID, ""), headers.get(PRIORITY_LEVEL_UID, "")


def _uids(stored: dict[str, dict], name: str, kind: str) -> str:
    return stored[f"{name}/{kind}"]["metadata"]["uid"]


def _builtin(admin_api: client.ApiClient, kind: str, name: str) -> str:
    flow = client.FlowcontrolApiserverV1Api(admin_api)
    read = flow.read_priority_level_configuration if kind == "PriorityLevelConfiguration" else flow.read_flow_schema
    return read(name, _request_timeout=TIMEOUT).metadata.uid


def test_the_operator_and_admission_requests_get_their_own_level_and_agents_do_not(admin_api, namespace,
                                                                                  chart_flowcontrol):
    fullname = f"{chart_flowcontrol['release']}-reversi"
    level = _uids(chart_flowcontrol, f"{fullname}-operator", "PriorityLevelConfiguration")
    ours = (_uids(chart_flowcontrol, f"{fullname}-operator", "FlowSchema"), level)
    operator = _token(admin_api, namespace, fullname)
    admission = _token(admin_api, namespace, f"{fullname}-admission")
    agent = _token(admin_api, namespace, "agent")
    runs = f"/apis/reversi.dev/v1alpha1/namespaces/{namespace}/runs"
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    # the API server takes a new FlowSchema into account within moments of its create
    wait_for(lambda: _classified(admin_api, operator, jobs) == ours, timeout=30,
             what="the operator's request classified into the chart's level")
    for path in (runs, jobs, "/api/v1/namespaces", "/version"):
        assert _classified(admin_api, operator, path) == ours, path
        assert _classified(admin_api, admission, path) == ours, path
    # the operator's Lease requests: the built-in level leader-election
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{fullname}-operator"
    assert _classified(admin_api, operator, lease) == (
        _uids(chart_flowcontrol, f"{fullname}-leader-election", "FlowSchema"),
        _builtin(admin_api, "PriorityLevelConfiguration", "leader-election"))
    # the admission replicas hold no Lease: theirs stay in the chart's level
    assert _classified(admin_api, admission, lease) == ours
    # an agent: where Kubernetes puts every other ServiceAccount
    assert _classified(admin_api, agent, runs) == (_builtin(admin_api, "FlowSchema", "service-accounts"),
                                                   _builtin(admin_api, "PriorityLevelConfiguration",
                                                            "workload-low"))


def test_the_same_service_account_elsewhere_is_not_selected(admin_api, namespace, chart_flowcontrol):
    """The schemas select ServiceAccounts of the release's namespace only: the same name in another
    namespace is an agent like any other."""
    fullname = f"{chart_flowcontrol['release']}-reversi"
    core = client.CoreV1Api(admin_api)
    other = f"{namespace[:50]}-other"
    core.create_namespace({"metadata": {"name": other, "labels": {"reversi.dev/test": "true"}}},
                          _request_timeout=TIMEOUT)
    try:
        ours = _token(admin_api, namespace, fullname)
        elsewhere = _token(admin_api, other, fullname)
        path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
        wait_for(lambda: _classified(admin_api, ours, path)[1] == _uids(
            chart_flowcontrol, f"{fullname}-operator", "PriorityLevelConfiguration"), timeout=30,
            what="the chart's level in force")
        assert _classified(admin_api, elsewhere, path) == (
            _builtin(admin_api, "FlowSchema", "service-accounts"),
            _builtin(admin_api, "PriorityLevelConfiguration", "workload-low"))
    finally:
        core.delete_namespace(other, propagation_policy="Background", _request_timeout=TIMEOUT)
