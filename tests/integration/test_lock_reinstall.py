"""The rollback lock survives its policy binding deleted and installed again (an uninstall and a new
install, an upgrade that replaces it), with no API server restart
(docs/operations.md#admission-where-each-rule-is-enforced). Its own control plane: deleting every
binding of the lock's param kind would open every locked run of the session's cluster to new steps."""

from __future__ import annotations

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from reversi.adapters import closed_runs, webhooks
from reversi.models.closedrunslice import SLICE_CAPACITY
from reversi_devcluster.cluster import Cluster, ClusterSettings
from reversi_devcluster.localop import apply_crds, free_port
from tests.helpers import wait_for

pytestmark = pytest.mark.cluster

LOCK = f"{webhooks.NAME}-runstep-lock"


def _probe(custom: client.CustomObjectsApi, run: str, uid: str) -> bool | None:
    """Whether the lock refuses a dry run of the run's next step (None: the API server answered
    with neither, e.g. while it configures a new policy)."""
    try:
        return closed_runs.probe(custom, "default", run, uid)
    except ApiException:
        return None


@pytest.fixture(scope="module")
def own_api(tmp_path_factory, cluster):
    """An API client of a control plane of this module's own, with the CRDs and the policies."""
    c = Cluster(ClusterSettings(
        cluster_dir=tmp_path_factory.mktemp("lock") / "cluster", apiserver_port=free_port(), etcd_port=free_port(),
        etcd_peer_port=free_port(), kubelet_port=free_port(), start_timeout=60))
    c.up(log=lambda *_: None)
    try:
        api = config.new_client_from_config(config_file=str(c.paths.admin_kubeconfig))
        apply_crds(api)
        webhooks.register_policies(api)
        yield api
    finally:
        c.down(quiet=True)


def test_the_lock_is_in_force_again_once_its_policy_is_installed_again(own_api):
    custom, adm = client.CustomObjectsApi(own_api), client.AdmissionregistrationV1Api(own_api)
    closed_runs.close(custom, "default", "locked", "uid-locked", "undo")
    wait_for(lambda: _probe(custom, "locked", "uid-locked"), timeout=60, what="the lock in force")
    assert _probe(custom, "open", "uid-open") is False, "a run no rollback closed takes steps"

    # helm uninstall: the policy and its binding go; the API server sees them go (the locked run
    # takes steps)
    adm.delete_validating_admission_policy_binding(LOCK)
    adm.delete_validating_admission_policy(LOCK)
    wait_for(lambda: _probe(custom, "locked", "uid-locked") is False, timeout=60,
             what="the API server to see the binding deleted")
    # helm install: the binding is back, and so is the lock, past the API server's 30 s discovery
    # refresh at most; the entries were kept (the slices outlive a release)
    webhooks.register_policies(own_api)
    wait_for(lambda: _probe(custom, "locked", "uid-locked"), timeout=60,
             what="the lock in force again with no API server restart")
    body = closed_runs.probe_body("default", "locked", "uid-locked")
    body["spec"]["tool"] = "payments.create_charge"
    with pytest.raises(ApiException) as refused:
        custom.create_namespaced_custom_object("reversi.dev", "v1alpha1", "default", "runsteps", body)
    assert refused.value.status == 403 and "run is being rolled back by RollbackRequest undo" in refused.value.body


def test_a_full_slice_is_refused_by_name_and_an_earlier_configmap_is_carried_over(own_api):
    custom, core = client.CustomObjectsApi(own_api), client.CoreV1Api(own_api)
    # a slice holds SLICE_CAPACITY runs: one more is refused by the schema, and said by name
    name = closed_runs.slice_name("one-too-many")
    filler = {f"filler-{i}": f"uid-{i} undo" for i in range(SLICE_CAPACITY)}
    custom.create_namespaced_custom_object("reversi.dev", "v1alpha1", "default", closed_runs.PLURAL, {
        "apiVersion": "reversi.dev/v1alpha1", "kind": "ClosedRunSlice", "metadata": {"name": name},
        "spec": {"runs": filler}})
    with pytest.raises(closed_runs.SliceFull, match=f"ClosedRunSlice default/{name} holds {SLICE_CAPACITY}"):
        closed_runs.close(custom, "default", "one-too-many", "uid-2", "undo")
    held = custom.get_namespaced_custom_object("reversi.dev", "v1alpha1", "default", closed_runs.PLURAL, name)
    assert len(held["spec"]["runs"]) == SLICE_CAPACITY and "one-too-many" not in held["spec"]["runs"]

    # the ConfigMap of an earlier version: its entries move to the slices, and it goes; a run the
    # slices already hold (a Run of that name created again and closed since) keeps its newer entry
    closed_runs.close(custom, "default", "renewed-run", "uid-renewed", "undo-renewed")
    core.create_namespaced_config_map("default", {"metadata": {"name": closed_runs.EARLIER_CONFIGMAP}, "data": {
        "old-run": "uid-old undo-old ended", "older-run": "uid-older undo-older",
        "renewed-run": "uid-stale undo-stale ended"}})
    assert closed_runs.carry_over(core, custom, "default") == 2
    assert closed_runs.carry_over(core, custom, "default") == 0, "the ConfigMap is deleted once moved"
    wait_for(lambda: _probe(custom, "old-run", "uid-old"), timeout=30, what="the carried-over lock in force")
    assert _probe(custom, "older-run", "uid-older")
    assert _probe(custom, "old-run", "uid-of-a-new-run-of-that-name") is False
    assert _probe(custom, "renewed-run", "uid-renewed") and _probe(custom, "renewed-run", "uid-stale") is False
