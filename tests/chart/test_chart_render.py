"""The chart without a cluster: lint, the CRDs it ships, what it renders, and the values it refuses."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
import yaml

from tests.chart.chartkit import ALL_FEATURES, CHART, REPO, find, run

CONTRACT_PATHS = {
    "mutating": {"/mutate-run": (["runs"], ["CREATE", "UPDATE"]),
                 "/mutate-runstep": (["runsteps"], ["CREATE", "UPDATE"]),
                 "/mutate-rollbackrequest": (["rollbackrequests"], ["CREATE", "UPDATE"])},
    "validating": {"/validate-run": (["runs"], ["CREATE", "UPDATE"]),
                   "/validate-runstep": (["runsteps"], ["UPDATE", "DELETE"]),
                   "/validate-rollbackrequest": (["rollbackrequests"], ["CREATE", "UPDATE"]),
                   "/validate-toolmanifest": (["toolmanifests"], ["CREATE", "UPDATE"]),
                   "/validate-halt": (["halts"], ["CREATE", "UPDATE"]),
                   "/validate-clusterhalt": (["clusterhalts"], ["CREATE", "UPDATE"])},
}


# ------------------------------------------------------------------------------------- lint

def test_lint_with_default_values(helm):
    run([helm, "lint", "--strict", CHART])


def test_lint_with_every_optional_feature_on(helm, tmp_path):
    values = tmp_path / "all.yaml"
    values.write_text(yaml.safe_dump(ALL_FEATURES))
    run([helm, "lint", "--strict", CHART, "--values", values])


# ------------------------------------------------------------------------------------- CRDs

def test_chart_crds_are_the_generated_crds(render):
    """The chart renders crds/ exactly (they are templates, so `helm upgrade` updates them),
    annotated helm.sh/resource-policy: keep; regenerate both with `make crds`."""
    ours = {yaml.safe_load(p.read_text())["metadata"]["name"]: yaml.safe_load(p.read_text())
            for p in (REPO / "crds").glob("*.yaml")}
    assert ours, "no CRDs in crds/"
    rendered = {o["metadata"]["name"]: o for o in render() if o["kind"] == "CustomResourceDefinition"}
    assert sorted(rendered) == sorted(ours)
    for name, crd in rendered.items():
        assert crd["metadata"]["annotations"].pop("helm.sh/resource-policy") == "keep"
        assert crd == ours[name], f"the chart's template of {name} is stale: run make crds"


def test_crds_can_be_left_out_or_left_to_helm_uninstall(render):
    assert not [o for o in render({"crds": {"enabled": False}}) if o["kind"] == "CustomResourceDefinition"]
    unkept = [o for o in render({"crds": {"keep": False}}) if o["kind"] == "CustomResourceDefinition"]
    assert len(unkept) == 7 and all("helm.sh/resource-policy" not in o["metadata"]["annotations"] for o in unkept)


def test_chart_has_no_crds_folder():
    """Helm installs its crds/ folder once and never upgrades it: Reversi's CRDs are templates, and
    kopf's peering CRDs are gone with peering (docs/operations.md#leader-election)."""
    assert not (CHART / "crds").exists()


# --------------------------------------------------------------------------- default render

def test_default_render_has_the_expected_objects(render):
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in render())
    assert kinds == sorted([
        ("ServiceAccount", "rv-reversi"), ("Secret", "rv-reversi-webhook-tls"),
        ("ClusterRole", "rv-reversi"), ("ClusterRole", "rv-reversi-cluster"),
        ("ClusterRoleBinding", "rv-reversi"), ("ClusterRoleBinding", "rv-reversi-cluster"),
        ("ClusterRole", "rv-reversi-view"), ("ClusterRole", "rv-reversi-edit"), ("ClusterRole", "rv-reversi-approve"),
        ("ClusterRole", "rv-reversi-acknowledge"),
        ("ClusterRole", "rv-reversi-force"),
        # the agents' roles (docs/operations.md#an-agents-rights)
        ("ClusterRole", "rv-reversi-record"), ("ClusterRole", "rv-reversi-recover"),
        ("Service", "rv-reversi"), ("Service", "rv-reversi-operator"), ("Deployment", "rv-reversi"),
        # leader election of the operator's two replicas (docs/operations.md#leader-election)
        ("PodDisruptionBudget", "rv-reversi"), ("Role", "rv-reversi-leader-election"),
        ("RoleBinding", "rv-reversi-leader-election"),
        # API Priority and Fairness (docs/operations.md#api-priority-and-fairness; test_chart_flowcontrol.py)
        ("PriorityLevelConfiguration", "rv-reversi-operator"), ("FlowSchema", "rv-reversi-operator"),
        ("FlowSchema", "rv-reversi-leader-election"),
        ("MutatingWebhookConfiguration", "rv-reversi"), ("ValidatingWebhookConfiguration", "rv-reversi"),
        ("ValidatingWebhookConfiguration", "rv-reversi-record"),
        # the admission server: its own Deployment, identity and roles, and the API server's policy
        ("Deployment", "rv-reversi-admission"), ("PodDisruptionBudget", "rv-reversi-admission"),
        ("ServiceAccount", "rv-reversi-admission"),
        ("ClusterRole", "rv-reversi-admission"), ("ClusterRole", "rv-reversi-admission-cluster"),
        ("ClusterRoleBinding", "rv-reversi-admission"), ("ClusterRoleBinding", "rv-reversi-admission-cluster"),
        ("ValidatingAdmissionPolicy", "rv-reversi-runstep-outcome"),
        ("ValidatingAdmissionPolicyBinding", "rv-reversi-runstep-outcome"),
        # the recorded call's policies (recording-policies.yaml)
        ("MutatingAdmissionPolicy", "rv-reversi-runstep-stamp"),
        ("MutatingAdmissionPolicyBinding", "rv-reversi-runstep-stamp"),
        *[(kind, f"rv-reversi-runstep-{what}") for what in ("record", "halts", "clusterhalts", "lock")
          for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")],
        *[("CustomResourceDefinition", f"{plural}.reversi.dev") for plural in (
            "runs", "runsteps", "rollbackrequests", "toolmanifests", "halts", "clusterhalts", "closedrunslices")],
    ])


def test_deployment_runs_one_restricted_operator(render):
    dep = find(render(), "Deployment", "rv-reversi")
    spec = dep["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/reversi-dev/reversi-operator:0.1.0"
    assert container["command"] == ["reversi-operator"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["runAsNonRoot"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["REVERSI_METRICS_PORT"] == "8080" and not any(n.startswith("REVERSI_WEBHOOK") for n in env)
    assert env["REVERSI_NAMESPACES"] == ""
    assert not any("PEERING" in n for n in env)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert list(mounts) == ["/tmp"], "the operator serves no webhook: it mounts no certificate"


def test_admission_server_runs_apart_in_replicas_that_are_never_all_down(render):
    """reversi-admission: restricted like the operator, 2 replicas that roll one at a time, a
    PodDisruptionBudget, the certificate, its own ServiceAccount, and the webhook port ready first."""
    objs = render()
    dep = find(objs, "Deployment", "rv-reversi-admission")
    spec = dep["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "rv-reversi-admission"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["command"] == ["reversi-admission"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["REVERSI_WEBHOOK_PORT"] == "9443" and env["REVERSI_WEBHOOK_CERT"] == "/etc/reversi/webhook/tls.crt"
    assert env["REVERSI_WEBHOOK_KEY"] == "/etc/reversi/webhook/tls.key"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/reversi/webhook"]["readOnly"] is True
    assert container["readinessProbe"]["tcpSocket"]["port"] == "webhook"
    assert pod["affinity"]["podAntiAffinity"], "replicas prefer different nodes"
    pdb = find(objs, "PodDisruptionBudget", "rv-reversi-admission")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]
    assert spec["selector"]["matchLabels"] != find(objs, "Deployment", "rv-reversi")["spec"]["selector"]["matchLabels"]
    one = render({"admission": {"replicas": 1}})
    assert not [o for o in one if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == "rv-reversi-admission"
                ], "a budget of one replica would block drains"


def test_every_env_var_is_an_operator_setting(render):
    """A REVERSI_* variable the operator does not know would be ignored silently."""
    from reversi.settings import OperatorSettings

    known = {f"REVERSI_{name.upper()}" for name in OperatorSettings.model_fields}
    for values in (None, ALL_FEATURES):
        for dep in ("rv-reversi", "rv-reversi-admission"):
            container = find(render(values), "Deployment", dep)["spec"]["template"]["spec"]["containers"][0]
            names = {e["name"] for e in container["env"]}
            assert names <= known, f"unknown settings of {dep}: {sorted(names - known)}"


def test_retention_defaults_to_thirty_days_and_null_keeps_every_run(render):
    def env(values):
        container = find(render(values), "Deployment", "rv-reversi")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e.get("value") for e in container["env"]}

    found = env(None)
    assert found["REVERSI_RETENTION_TTL_SECONDS"] == "2592000" and found["REVERSI_RETENTION_DELETES_PER_SECOND"] == "20"
    assert "REVERSI_RETENTION_TTL_SECONDS" not in env({"retention": {"ttlSeconds": None}})
    assert env({"retention": {"ttlSeconds": 315360000}})["REVERSI_RETENTION_TTL_SECONDS"] == "315360000"


def test_the_archive_takes_its_connection_string_from_a_secret_never_from_values(render):
    def env(values):
        container = find(render(values), "Deployment", "rv-reversi")["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e for e in container["env"]}

    assert "REVERSI_ARCHIVE_DSN" not in env(None), "off by default"
    found = env({"archive": {"enabled": True, "existingSecret": "reversi-archive"}})["REVERSI_ARCHIVE_DSN"]
    assert found == {"name": "REVERSI_ARCHIVE_DSN", "valueFrom": {"secretKeyRef": {"name": "reversi-archive",
                                                                                     "key": "dsn"}}}
    assert "existingSecret" in render.errors({"archive": {"enabled": True}})



def test_the_admission_server_knows_the_archive_is_on_but_never_its_connection_string(render):
    def env(values):
        container = find(render(values), "Deployment", "rv-reversi-admission")["spec"]["template"]["spec"][
            "containers"][0]
        return {e["name"]: e for e in container["env"]}

    assert "REVERSI_ARCHIVE_ENABLED" not in env(None), "off by default"
    on = env({"archive": {"enabled": True, "existingSecret": "reversi-archive"}})
    assert on["REVERSI_ARCHIVE_ENABLED"]["value"] == "true", "each new Run gets the archive's finalizer"
    assert "REVERSI_ARCHIVE_DSN" not in on


def test_journal_quota_is_rendered_in_each_listed_namespace_and_matches_the_example(render):
    assert not [o for o in render() if o["kind"] == "ResourceQuota"], "no quota unless namespaces are listed"
    quotas = [o for o in render({"journalQuota": {"namespaces": ["shop", "billing"], "runsteps": 5000}})
              if o["kind"] == "ResourceQuota"]
    assert [(q["metadata"]["name"], q["metadata"]["namespace"]) for q in quotas] == [
        ("rv-reversi-journal", "shop"), ("rv-reversi-journal", "billing")]
    assert quotas[0]["spec"]["hard"] == {"count/runsteps.reversi.dev": "5000", "count/runs.reversi.dev": "20000"}
    example = yaml.safe_load((REPO / "docs" / "examples" / "journal-quota.yaml").read_text())
    assert set(example["spec"]["hard"]) == set(quotas[0]["spec"]["hard"])


def test_services_serve_webhooks_and_each_deployments_metrics(render):
    objs = render()
    svc = find(objs, "Service", "rv-reversi")  # the name the webhook certificate is for
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    assert ports["metrics"]["port"] == 8080 and ports["metrics"]["targetPort"] == "metrics"
    assert ports["webhook"]["port"] == 443 and ports["webhook"]["targetPort"] == "webhook"
    admission = find(objs, "Deployment", "rv-reversi-admission")
    container_ports = {p["name"]: p["containerPort"]
                       for p in admission["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert container_ports == {"health": 8081, "metrics": 8080, "webhook": 9443}
    assert svc["spec"]["selector"] == admission["spec"]["selector"]["matchLabels"]
    operator_svc = find(objs, "Service", "rv-reversi-operator")
    dep = find(objs, "Deployment", "rv-reversi")
    assert [p["name"] for p in operator_svc["spec"]["ports"]] == ["metrics"]
    assert operator_svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    container_ports = {p["name"]: p["containerPort"] for p in dep["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert container_ports == {"health": 8081, "metrics": 8080}
    for deployment in (dep, admission):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        liveness = container["livenessProbe"]["httpGet"]
        assert (liveness["path"], liveness["port"]) == ("/healthz", "health"), "liveness is kopf's own endpoint"
        assert {"name": "REVERSI_HEALTH_PORT", "value": "8081"} in container["env"]


# ----------------------------------------------------------------------------------- RBAC

def _rules(objs: list[dict]) -> list[dict]:
    return [r for o in objs if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]]


def _operator_rules(objs: list[dict], sa: str = "rv-reversi") -> list[dict]:
    """The rules of the roles bound to the operator's ServiceAccount."""
    bound = {o["roleRef"]["name"] for o in objs if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s["kind"] == "ServiceAccount" and s["name"] == sa for s in o["subjects"])}
    return _rules([o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] in bound])


@pytest.mark.parametrize("values", [None, ALL_FEATURES], ids=["default", "all-features"])
def test_rbac_has_no_wildcards(render, values):
    for rule in _rules(render(values)):
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(key, []), f"wildcard in {rule}"
        assert "nonResourceURLs" not in rule
        if "resourceNames" in rule:  # narrows a rule to named objects: only for verbs that name one object
            # (list and watch name it with a field selector metadata.name, which RBAC matches: the Lease's watch)
            assert "*" not in rule["resourceNames"] and set(rule["verbs"]) <= {"get", "patch", "update", "delete",
                                                                                "list", "watch"}, rule


def _grants(objs: list[dict]) -> set[tuple[str, str, str]]:
    """What the operator's ServiceAccount may do."""
    return {(g, r, v) for rule in _operator_rules(objs) for g in rule["apiGroups"] for r in rule["resources"]
            for v in rule["verbs"]}


def test_rbac_grants_what_the_operator_needs_and_no_more(render):
    grants = _grants(render())
    kinds = ("runs", "runsteps", "rollbackrequests", "toolmanifests", "halts", "clusterhalts")
    needed = {("reversi.dev", k, v) for k in kinds for v in ("get", "list", "watch")}
    needed |= {("reversi.dev", f"{k}/status", "patch") for k in kinds}
    # moving the inline journal of a 0.1 Run; the lock's dry-run probe
    needed |= {("reversi.dev", "runsteps", "create")}
    # a rollback's lock as the API server enforces it: the namespace's ClosedRunSlices; the ConfigMap of an
    # earlier version, moved to them and deleted (narrowed to its name below)
    needed |= {("reversi.dev", "closedrunslices", v) for v in ("get", "create", "patch")}
    needed |= {("", "configmaps", "get"), ("", "configmaps", "delete")}
    # retention: an expired Run is deleted (its steps go with it), each namespace's setting is watched
    needed |= {("reversi.dev", "runs", "delete"), ("", "namespaces", "get"), ("", "namespaces", "list"),
               ("", "namespaces", "watch"), ("", "resourcequotas", "get"), ("", "resourcequotas", "list")}
    # the archive's finalizer on each Run: added, and removed once a deleted Run's record is in (a merge patch)
    needed |= {("reversi.dev", "runs", "patch")}
    # nested runs: the request of a parent run makes (and cancels) one request per child run
    needed |= {("reversi.dev", "rollbackrequests", "create"), ("reversi.dev", "rollbackrequests", "patch")}
    needed |= {("reversi.dev", "runs/finalizers", "update"),
               ("batch", "jobs", "create"), ("batch", "jobs", "get"), ("batch", "jobs", "list"),
               ("batch", "jobs", "watch"), ("", "secrets", "create"), ("", "pods", "get"), ("", "pods", "list"),
               ("", "pods/log", "get"), ("", "events", "create"), ("", "events", "patch"), ("", "events", "list"),
               ("events.k8s.io", "events", "create"), ("events.k8s.io", "events", "patch"),
               ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
               ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
               ("apiextensions.k8s.io", "customresourcedefinitions", "watch")}
    # the recording webhook's match condition (narrowed to its name below)
    needed |= {("admissionregistration.k8s.io", "validatingwebhookconfigurations", v)
               for v in ("get", "list", "watch", "patch")}
    assert grants == needed, f"missing: {sorted(needed - grants)}; extra: {sorted(grants - needed)}"
    for rule in _operator_rules(render()):
        if "validatingwebhookconfigurations" in rule["resources"]:
            assert rule.get("resourceNames") == ["rv-reversi-record"], rule
        if "configmaps" in rule["resources"]:  # the operator reads and deletes no ConfigMap but the earlier lock's
            assert rule.get("resourceNames") == ["reversi-closed-runs"], rule
    never = {("", "secrets", "get"), ("", "secrets", "list"), ("batch", "jobs", "delete"),
             ("reversi.dev", "runsteps", "delete"), ("reversi.dev", "rollbackrequests", "delete"),
             ("reversi.dev", "runs", "update"), ("", "pods", "create")}
    assert not grants & never


def test_rbac_grants_the_admission_server_what_its_checks_read_and_no_more(render):
    grants = {(g, r, v) for rule in _operator_rules(render(), "rv-reversi-admission") for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}
    needed = {("reversi.dev", k, v) for k in ("runs", "runsteps", "halts", "clusterhalts") for v in ("get", "list")}
    needed |= {("reversi.dev", "toolmanifests", v) for v in ("get", "list", "watch")}
    # the recording webhook: the Runs that record (a watch), and the steps it records and settles
    needed |= {("reversi.dev", "runs", "watch"), ("reversi.dev", "runsteps", "create"),
               ("reversi.dev", "runsteps", "patch")}
    needed |= {("reversi.dev", "halts/status", "patch"), ("reversi.dev", "clusterhalts/status", "patch"),
               ("batch", "jobs", "create"),  # a dry run of a runner's Job
               ("", "serviceaccounts", "get"),  # a Run recording an account that does not exist is warned
               ("authorization.k8s.io", "subjectaccessreviews", "create"),
               *{("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("get", "list", "watch")}}
    assert grants == needed, f"missing: {sorted(needed - grants)}; extra: {sorted(grants - needed)}"


def test_watch_namespaces_binds_write_access_per_namespace(render):
    objs = render({"watchNamespaces": ["shop", "billing"]})
    bindings = [o for o in objs if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] != "reversi-system"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["billing", "billing", "shop", "shop"]
    assert sorted(b["roleRef"]["name"] for b in bindings) == ["rv-reversi", "rv-reversi", "rv-reversi-admission",
                                                             "rv-reversi-admission"]
    assert sorted(o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRoleBinding") == [
        "rv-reversi-admission-cluster", "rv-reversi-cluster"]
    cluster_role = find(objs, "ClusterRole", "rv-reversi-cluster")
    grants = {(g, r, v) for rule in cluster_role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
              for v in rule["verbs"]}
    assert ("", "namespaces", "list") in grants and ("", "namespaces", "watch") in grants
    assert ("reversi.dev", "runs", "list") in grants  # the gauges list Runs cluster-wide
    for dep in ("rv-reversi", "rv-reversi-admission"):
        env = {e["name"]: e.get("value") for e in
               find(objs, "Deployment", dep)["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["REVERSI_NAMESPACES"] == "shop,billing"


def _crd_patches(objs: list[dict]) -> list[list[str]]:
    """The CRDs the operator may patch, one list per rule (none may patch every CRD)."""
    return [rule.get("resourceNames", ["*"]) for rule in _operator_rules(objs)
            if "customresourcedefinitions" in rule["resources"] and "patch" in rule["verbs"]]


def test_leader_election_grants_the_one_lease_by_name_and_create_in_the_release_namespace(render):
    """Two replicas elect the one at work through the Lease <fullname>-operator
    (docs/operations.md#leader-election): get, update, list and watch on that Lease by name, create on leases
    of the release namespace (a create cannot be narrowed to a name), nothing on kopf's peering;
    the pod's name is its holderIdentity, and the timings are client-go's unless set."""
    assert _crd_patches(render()) == []
    for values in ({}, {"watchNamespaces": ["shop"]}):
        objs = render(values)
        assert not [o for o in objs if "Peering" in o["kind"]]
        assert not [g for g in _grants(objs) if g[0] == "kopf.dev"]
        role = find(objs, "Role", "rv-reversi-leader-election")
        assert role["metadata"]["namespace"] == "reversi-system"
        assert role["rules"] == [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["rv-reversi-operator"],
             "verbs": ["get", "update", "list", "watch"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
        binding = find(objs, "RoleBinding", "rv-reversi-leader-election")
        assert binding["roleRef"]["name"] == "rv-reversi-leader-election"
        assert binding["subjects"][0]["name"] == "rv-reversi"
    dep = find(render({"leaderElection": {"leaseSeconds": 30}}), "Deployment", "rv-reversi")
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["REVERSI_LEASE_NAME"]["value"] == "rv-reversi-operator"
    assert env["REVERSI_LEASE_NAMESPACE"]["value"] == "reversi-system"
    assert env["REVERSI_LEADER_IDENTITY"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert (env["REVERSI_LEASE_SECONDS"]["value"], env["REVERSI_RENEW_DEADLINE_SECONDS"]["value"],
            env["REVERSI_RETRY_PERIOD_SECONDS"]["value"]) == ("30", "10", "2")


def test_two_operator_replicas_spread_over_nodes_with_a_disruption_budget_and_one_stays_possible(render):
    """Two replicas by default, apart on different nodes where there are several, a
    PodDisruptionBudget of minAvailable 1; one replica renders no budget (it would block every drain)."""
    objs = render()
    pdb = find(objs, "PodDisruptionBudget", "rv-reversi")
    dep = find(objs, "Deployment", "rv-reversi")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    pod = dep["spec"]["template"]["spec"]
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    single = render({"replicaCount": 1})
    assert find(single, "Deployment", "rv-reversi")["spec"]["replicas"] == 1
    assert find(single, "Deployment", "rv-reversi")["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 1
    assert not [o for o in single if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == "rv-reversi"]
    own = render({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}]}}}})
    assert list(find(own, "Deployment", "rv-reversi")["spec"]["template"]["spec"]["affinity"]) == ["nodeAffinity"]


def test_user_roles_join_the_built_in_roles_and_approving_stays_apart(render):
    objs = render()
    view, edit, approve = (find(objs, "ClusterRole", f"rv-reversi-{n}") for n in ("view", "edit", "approve"))
    agg = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k for k in view["metadata"]["labels"] if k.startswith(agg)} == {agg + "view", agg + "edit", agg + "admin"}
    assert {k for k in edit["metadata"]["labels"] if k.startswith(agg)} == {agg + "edit", agg + "admin"}
    assert not any(k.startswith(agg) for k in approve["metadata"]["labels"]), "approve must be granted explicitly"
    assert approve["rules"] == [{"apiGroups": ["reversi.dev"], "resources": ["rollbackrequests"], "verbs": ["approve"]}]
    force = find(objs, "ClusterRole", "rv-reversi-force")
    assert not any(k.startswith(agg) for k in force["metadata"]["labels"]), "force must be granted explicitly"
    assert force["rules"] == [{"apiGroups": ["reversi.dev"], "resources": ["rollbackrequests"], "verbs": ["force"]}]
    for role in (view, edit):
        resources = {r for rule in role["rules"] for r in rule["resources"]}
        assert "clusterhalts" not in resources and not any("/" in r for r in resources)
        # whoever may change a ClosedRunSlice reopens closed runs to new steps: the operator's alone
        assert "closedrunslices" not in resources
        assert all("approve" not in rule["verbs"] for rule in role["rules"])
    assert not [o for o in render({"rbac": {"userRoles": False}}) if o["metadata"]["name"].endswith("-approve")]


# ------------------------------------------------------------------------------- webhooks

def _hooks(objs: list[dict]) -> dict[str, dict[str, dict]]:
    out = {}
    for kind, key in (("MutatingWebhookConfiguration", "mutating"), ("ValidatingWebhookConfiguration", "validating")):
        out[key] = {h["clientConfig"]["service"]["path"]: h for h in find(objs, kind, "rv-reversi")["webhooks"]}
    return out


def test_the_recording_webhook_is_the_local_control_planes_and_records_no_one_until_the_operator_says(render):
    """The chart's recording configuration is :func:`reversi.adapters.webhooks.record_configuration` with no
    user recorded; the operator then keeps its match condition (docs/concepts.md#recording-with-no-agent-code)."""
    from reversi.adapters import webhooks

    got = find(render(), "ValidatingWebhookConfiguration", "rv-reversi-record")["webhooks"]
    want = webhooks.record_configuration(lambda hook: {"service": {"path": hook.path}}, {})["webhooks"]
    assert len(got) == len(want) == 1
    for key in ("name", "rules", "sideEffects", "failurePolicy", "matchPolicy", "admissionReviewVersions",
                "matchConditions"):
        assert got[0][key] == want[0][key], key
    assert got[0]["clientConfig"]["service"]["path"] == want[0]["clientConfig"]["service"]["path"]


def test_webhooks_follow_the_contract(render):
    hooks = _hooks(render())
    for kind, paths in CONTRACT_PATHS.items():
        assert set(hooks[kind]) == set(paths)
        for path, (resources, operations) in paths.items():
            hook = hooks[kind][path]
            (rule,) = hook["rules"]
            assert rule["apiGroups"] == ["reversi.dev"] and rule["apiVersions"] == ["v1alpha1"]
            assert rule["resources"] == resources and rule["operations"] == operations
            assert hook["admissionReviewVersions"] == ["v1"]
            assert hook["sideEffects"] in ("None", "NoneOnDryRun")
            assert hook["timeoutSeconds"] == 10
            assert hook["failurePolicy"] == ("Ignore" if path.endswith("halt") else "Fail"), path
            assert hook["clientConfig"]["service"] == {"name": "rv-reversi", "namespace": "reversi-system",
                                                       "path": path, "port": 443}


def test_webhooks_and_the_outcome_policy_are_the_local_control_planes(render):
    """The chart renders what the local control plane registers (operator/reversi/adapters/webhooks.py):
    the same rules, side effects and match conditions, and the same ValidatingAdmissionPolicy, so
    the hot path tested locally (one webhook per recorded call, none on the outcome write) is the
    one the chart installs."""
    from reversi.adapters import webhooks

    objs = render()
    hooks = _hooks(objs)
    for kind in ("mutating", "validating"):
        ours = webhooks.configuration(kind, lambda hook: {"service": {"path": hook.path}})
        for want in ours["webhooks"]:
            got = hooks[kind][want["clientConfig"]["service"]["path"]]
            for key in ("name", "rules", "sideEffects", "matchPolicy", "admissionReviewVersions"):
                assert got[key] == want[key], (want["name"], key)
            assert got.get("matchConditions") == want.get("matchConditions"), want["name"]
            assert got.get("reinvocationPolicy") == want.get("reinvocationPolicy"), want["name"]
    from reversi.adapters import policies

    rendered = {(o["kind"], o["metadata"]["name"]): o for o in objs
                if o["kind"].endswith(("AdmissionPolicy", "AdmissionPolicyBinding"))}
    outcome = "rv-reversi-runstep-outcome"
    # the recorder is the admission server's ServiceAccount (docs/concepts.md#recording-with-no-agent-code)
    admission = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("admission"))
    recorder = (f"system:serviceaccount:{admission['metadata']['namespace']}:"
                f"{admission['spec']['template']['spec']['serviceAccountName']}")
    ours = [webhooks.outcome_policy(outcome, recorder), webhooks.outcome_binding(outcome),
            *policies.recording_policies("rv-reversi", recorder)]
    assert set(rendered) == {(o["kind"], o["metadata"]["name"]) for o in ours}
    for want in ours:
        assert rendered[(want["kind"], want["metadata"]["name"])]["spec"] == want["spec"], want["metadata"]["name"]


def test_no_policy_rests_on_a_configmap_param_and_the_lock_on_every_closed_run_slice(render):
    """The lock's params are the namespace's ClosedRunSlices, all of them (a selector, not one name);
    no policy takes a built-in param kind (docs/concepts.md#admission)."""
    objs = render()
    for policy in (o for o in objs if o["kind"].endswith("AdmissionPolicy")):
        assert (policy["spec"].get("paramKind") or {}).get("kind") != "ConfigMap", policy["metadata"]["name"]
    lock = find(objs, "ValidatingAdmissionPolicy", "rv-reversi-runstep-lock")
    assert lock["spec"]["paramKind"] == {"apiVersion": "reversi.dev/v1alpha1", "kind": "ClosedRunSlice"}
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "rv-reversi-runstep-lock")
    assert binding["spec"]["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Allow"}


def test_webhooks_match_the_operators_admission_handlers(render):
    """Every kopf admission handler the operator registers has its webhook, with the same path
    (the handler id), resource, operations and side effects — and no webhook points nowhere."""
    import kopf

    import reversi.handlers.admission  # noqa: F401 - registers the admission handlers

    handlers = {}
    for h in kopf.get_default_registry()._webhooks.get_all_handlers():
        kind = "mutating" if "mutat" in str(h.reason).lower() else "validating"
        handlers[(kind, f"/{h.id}")] = h
    hooks = _hooks(render())
    rendered = {(kind, path) for kind, paths in hooks.items() for path in paths}
    assert rendered == set(handlers), (f"webhooks without a handler: {sorted(rendered - set(handlers))}; "
                                       f"handlers without a webhook: {sorted(set(handlers) - rendered)}")
    for (kind, path), h in handlers.items():
        hook = hooks[kind][path]
        assert hook["rules"][0]["resources"] == [h.selector.any_name or h.selector.plural]
        assert hook["rules"][0]["operations"] == list(h.operations or ["*"])
        assert hook["sideEffects"] == ("NoneOnDryRun" if h.side_effects else "None")


def test_webhook_certificate_is_for_the_service_and_shared(render):
    from cryptography import x509

    objs = render()
    secret = find(objs, "Secret", "rv-reversi-webhook-tls")
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    crt_pem = base64.b64decode(secret["data"]["tls.crt"])
    for hooks in _hooks(objs).values():
        for hook in hooks.values():
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca_pem
    cert = x509.load_pem_x509_certificate(crt_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    assert cert.issuer == ca.subject
    ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes,
                           *_verify_args(cert))  # signed by the CA in the bundle
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "rv-reversi.reversi-system.svc" in names
    annotations = find(objs, "Deployment", "rv-reversi-admission")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/webhook-tls"] == hashlib.sha256(crt_pem).hexdigest()


def _verify_args(cert):
    from cryptography.hazmat.primitives.asymmetric import padding

    return (padding.PKCS1v15(), cert.signature_hash_algorithm)


def test_webhook_failure_policy_and_selectors_are_configurable(render):
    objs = render({"webhook": {"failurePolicy": "Ignore", "timeoutSeconds": 5,
                               "namespaceSelector": {"matchLabels": {"reversi": "on"}}}})
    for hooks in _hooks(objs).values():
        for hook in hooks.values():
            assert hook["failurePolicy"] == "Ignore" and hook["timeoutSeconds"] == 5  # halts: Ignore anyway
            assert hook["namespaceSelector"] == {"matchLabels": {"reversi": "on"}}


def test_webhooks_off_renders_no_webhook_objects(render):
    objs = render({"webhook": {"enabled": False}})
    kinds = {o["kind"] for o in objs}
    assert not kinds & {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Secret",
                        "ValidatingAdmissionPolicy"}
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "PodDisruptionBudget"] == ["rv-reversi"]
    container = find(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert not any(e["name"].startswith("REVERSI_WEBHOOK") for e in container["env"])
    assert [p["name"] for p in container["ports"]] == ["health", "metrics"]
    assert [p["name"] for p in find(objs, "Service")["spec"]["ports"]] == ["metrics"]


def test_cert_manager_issues_the_certificate_and_injects_the_ca(render):
    objs = render({"webhook": {"certManager": {"enabled": True}}})
    assert not [o for o in objs if o["kind"] == "Secret"]
    cert = find(objs, "Certificate")
    issuer = find(objs, "Issuer")
    assert cert["spec"]["secretName"] == "rv-reversi-webhook-tls"
    assert cert["spec"]["issuerRef"] == {"name": issuer["metadata"]["name"], "kind": "Issuer",
                                         "group": "cert-manager.io"}
    assert "rv-reversi.reversi-system.svc" in cert["spec"]["dnsNames"]
    for kind, name in (("MutatingWebhookConfiguration", "rv-reversi"), ("ValidatingWebhookConfiguration", "rv-reversi"),
                       ("ValidatingWebhookConfiguration", "rv-reversi-record")):
        conf = find(objs, kind, name)
        assert conf["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "reversi-system/rv-reversi-webhook"
        assert all("caBundle" not in h["clientConfig"] for h in conf["webhooks"])
    own = render({"webhook": {"certManager": {"enabled": True,
                                              "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}})
    assert not [o for o in own if o["kind"] == "Issuer"]
    assert find(own, "Certificate")["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}


# ------------------------------------------------------------------ monitoring objects

def test_service_monitor_sets_the_job_label_and_keeps_the_metrics_namespace(render):
    objs = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
                               "jobName": "reversi-prod"}})
    sm = find(objs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["jobLabel"] == "reversi.dev/prometheus-job"
    # both Deployments' metrics; the admission server's under a job of its own (ReversiAdmissionDown)
    for svc, job in (("rv-reversi-operator", "reversi-prod"), ("rv-reversi", "reversi-prod-admission")):
        labels = find(objs, "Service", svc)["metadata"]["labels"]
        assert labels["reversi.dev/prometheus-job"] == job
        assert all(labels[k] == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics"
    assert {"regex": "namespace", "action": "labeldrop"} in endpoint["relabelings"]


def test_prometheus_rule_carries_the_tested_rules(render):
    """The documented release renders the rules file as it is; another release the same rules,
    with the commands in the annotations naming its own objects (tests/chart/test_alert_commands.py)."""
    rules_file = yaml.safe_load((CHART / "files" / "alerts" / "reversi.rules.yaml").read_text())
    objs = render({"metrics": {"prometheusRule": {"enabled": True}}}, release="reversi")
    assert find(objs, "PrometheusRule")["spec"]["groups"] == rules_file["groups"]
    other = find(render({"metrics": {"prometheusRule": {"enabled": True}}}), "PrometheusRule")["spec"]["groups"]
    strip = [[{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]] for g in rules_file["groups"]]
    assert [[{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]] for g in other] == strip


def test_prometheus_rule_follows_job_name_alert_labels_and_disabled(render):
    objs = render({"metrics": {"jobName": "reversi-prod", "prometheusRule": {
        "enabled": True, "alertLabels": {"team": "payments", "severity": "page"},
        "disabled": ["ReversiUnverifiedUndo"]}}})
    rules = {r["alert"]: r for g in find(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert set(rules) == {"ReversiRollbackIncomplete", "ReversiCompensationFailed", "ReversiOperatorDown",
                          "ReversiAdmissionDown", "ReversiCRDSchemaOutdated", "ReversiJournalNearQuota",
                          "ReversiClosedRunsNearLimit", "ReversiRollbackRequestFailed",
                          "ReversiRollbackAwaitingApproval", "ReversiArchiveFailing"}
    assert 'job="reversi-prod"' in rules["ReversiOperatorDown"]["expr"]
    assert 'job="reversi-prod"' in rules["ReversiCRDSchemaOutdated"]["expr"]
    assert 'job="reversi-prod-admission"' in rules["ReversiAdmissionDown"]["expr"]
    assert "reversi-operator" not in json.dumps(rules)
    for rule in rules.values():
        assert rule["labels"]["team"] == "payments"
    # a rule's own severity stays: alertLabels only add
    assert rules["ReversiOperatorDown"]["labels"]["severity"] == "critical"
    # the approval wait is a value: an hour unless set
    assert 'job="reversi-prod"}) > 3600' in rules["ReversiRollbackAwaitingApproval"]["expr"]
    objs = render({"metrics": {"prometheusRule": {"enabled": True, "approvalWaitSeconds": 900}}})
    rules = {r["alert"]: r for g in find(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert rules["ReversiRollbackAwaitingApproval"]["expr"].rstrip().endswith("}) > 900")


def test_dashboard_config_map_holds_the_dashboard(render):
    objs = render({"dashboard": {"enabled": True, "namespace": "monitoring"}})
    cm = find(objs, "ConfigMap")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["reversi.json"]) == json.loads(
        (CHART / "files" / "dashboards" / "reversi.json").read_text())


def test_dashboard_job_variable_follows_metrics_job_name(render):
    """The dashboard's ``job`` variable defaults to the scrape job the chart names
    (``metrics.jobName``), so its panels read the release's own series."""
    objs = render({"dashboard": {"enabled": True}, "metrics": {"jobName": "reversi-prod"}})
    dashboard = json.loads(find(objs, "ConfigMap")["data"]["reversi.json"])
    (job,) = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
    assert job["query"] == job["current"]["value"] == "reversi-prod", job
    assert "reversi-operator" not in json.dumps(dashboard)


def test_every_optional_feature_renders(render):
    kinds = {o["kind"] for o in render(ALL_FEATURES)}
    assert {"ServiceMonitor", "PrometheusRule", "ConfigMap", "Certificate", "Issuer", "PodDisruptionBudget",
            "RoleBinding"} <= kinds


def test_image_digest_wins_over_the_tag(render):
    digest = "sha256:" + "a" * 64
    objs = render({"image": {"digest": digest, "tag": "9.9"}})
    for name in ("rv-reversi", "rv-reversi-admission"):
        dep = find(objs, "Deployment", name)
        assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == \
            f"ghcr.io/reversi-dev/reversi-operator@{digest}"


# ------------------------------------------------------------------------- values schema

@pytest.mark.parametrize("values, error", [
    ({"unknownKey": 1}, "additional properties 'unknownKey' not allowed"),
    ({"webhook": {"failurePolicy": "Sometimes"}}, "/webhook/failurePolicy"),
    ({"webhook": {"unknown": True}}, "additional properties 'unknown' not allowed"),
    ({"replicaCount": 6}, "/replicaCount"),
    ({"peering": {"enabled": True}}, "additional properties 'peering' not allowed"),  # gone: the Lease elects
    ({"leaderElection": {"leaseSeconds": 0}}, "/leaderElection/leaseSeconds"),
    ({"metrics": {"port": 70000}}, "/metrics/port"),
    ({"watchNamespaces": ["Not_A_Namespace"]}, "/watchNamespaces/0"),
    ({"image": {"digest": "latest"}}, "/image/digest"),
    ({"securityContext": {"privileged": True}}, "/securityContext/privileged"),
    ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
    ({"metrics": {"prometheusRule": {"disabled": ["NoSuchAlert"]}}}, "/metrics/prometheusRule/disabled/0"),
    ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval"),
    ({"webhook": {"certManager": {"issuerRef": {"kind": "ClusterIssuer"}}}}, "/webhook/certManager/issuerRef"),
    ({"operator": {"tickSeconds": 0}}, "/operator/tickSeconds"),
    ({"retention": {"ttlSeconds": 0}}, "/retention/ttlSeconds"),
    ({"retention": {"ttlSeconds": "30d"}}, "/retention/ttlSeconds"),
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else "")
def test_schema_refuses_bad_values(render, values, error):
    assert error in render.errors(values)


def test_schema_is_strict_at_every_level():
    """Every object of the schema with known properties refuses unknown ones, except those that
    are Kubernetes types passed through (selectors, affinity, security contexts, ...)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    passthrough = {"namespaceSelector", "objectSelector", "affinity", "podSecurityContext", "securityContext"}
    loose = []

    def walk(node: dict, path: str) -> None:
        if node.get("type") == "object" and "properties" in node and path.rsplit(".", 1)[-1] not in passthrough:
            if node.get("additionalProperties") is not False:
                loose.append(path or "<root>")
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}" if path else key)

    walk(schema, "")
    assert not loose, f"schema objects that accept unknown keys: {loose}"
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def covered(values: dict, node: dict, path: str) -> None:
        for key, value in values.items():
            assert key in node.get("properties", {}), f"values.yaml key {path}{key} is not in the schema"
            if isinstance(value, dict) and value and "properties" in node["properties"][key] \
                    and node["properties"][key].get("additionalProperties") is False:
                covered(value, node["properties"][key], f"{path}{key}.")

    covered(defaults, schema, "")


# ------------------------------------------------------------------------ Kubernetes versions

def test_an_older_cluster_is_refused_in_one_line_that_names_the_version_needed(helm):
    """The chart renders admissionregistration.k8s.io/v1 MutatingAdmissionPolicy, served from
    Kubernetes 1.36: its kubeVersion says so, and Helm refuses 1.35 in one line naming the range
    (docs/operations.md#install-with-helm)."""
    proc = run([helm, "template", "rv", CHART, "--kube-version", "1.35.4"], check=False)
    assert proc.returncode != 0
    assert "chart requires kubeVersion: >=1.36.0-0 which is incompatible with Kubernetes v1.35.4" in proc.stderr
    rendered = run([helm, "template", "rv", CHART, "--kube-version", "1.36.0"]).stdout
    assert "kind: MutatingAdmissionPolicy" in rendered and "apiVersion: admissionregistration.k8s.io/v1\n" in rendered


def test_the_kind_cluster_and_the_docs_name_the_version_the_chart_needs():
    """kind-config.yaml's node image and the docs' requirement agree with Chart.yaml's kubeVersion."""
    need = yaml.safe_load((CHART / "Chart.yaml").read_text())["kubeVersion"]
    minor = need.removeprefix(">=").split(".")[1]
    nodes = yaml.safe_load((REPO / "kind-config.yaml").read_text())["nodes"]
    assert {n["image"].split(":")[1].split("@")[0].rsplit(".", 1)[0] for n in nodes} == {f"v1.{minor}"}
    assert f"Kubernetes 1.{minor} or newer" in (REPO / "docs/operations.md").read_text()
    assert f"Requires Kubernetes 1.{minor}+" in (CHART / "README.md").read_text()
