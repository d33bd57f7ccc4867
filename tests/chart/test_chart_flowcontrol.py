"""The chart's API Priority and Fairness objects as ``helm template`` renders them, without a cluster
(docs/operations.md#api-priority-and-fairness): a priority level of the operator's and the admission
replicas' own, a FlowSchema that puts exactly their two ServiceAccounts in it, and one that keeps the
operator's Lease requests in the built-in level leader-election. The API server's own classification
is checked on the local control plane by tests/integration/test_flowcontrol.py."""

from __future__ import annotations

import pytest

from tests.chart.chartkit import find

FLOWCONTROL = {"PriorityLevelConfiguration", "FlowSchema"}
#: the suggested FlowSchemas' precedences (Kubernetes' bootstrap configuration): the last system
#: schema (kube-system-service-accounts) and the one every other ServiceAccount falls into
LAST_SYSTEM_PRECEDENCE, SERVICE_ACCOUNTS_PRECEDENCE = 900, 9000


def _flowcontrol(objs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs if o["kind"] in FLOWCONTROL}


def _service_accounts(schema: dict) -> set[tuple[str, str]]:
    """The (namespace, name) of every ServiceAccount a FlowSchema's rules select; fails on any other subject."""
    found = set()
    for rule in schema["spec"]["rules"]:
        for subject in rule["subjects"]:
            assert subject["kind"] == "ServiceAccount", f"{schema['metadata']['name']} selects a {subject['kind']}"
            found.add((subject["serviceAccount"]["namespace"], subject["serviceAccount"]["name"]))
    return found


def _pods_service_accounts(objs: list[dict], namespace: str) -> dict[str, tuple[str, str]]:
    return {o["metadata"]["name"]: (namespace, o["spec"]["template"]["spec"]["serviceAccountName"])
            for o in objs if o["kind"] == "Deployment"}


def test_defaults_a_level_that_lends_no_seat_and_two_flowschemas(render):
    objs = _flowcontrol(render())
    assert sorted(objs) == [("FlowSchema", "rv-reversi-leader-election"), ("FlowSchema", "rv-reversi-operator"),
                            ("PriorityLevelConfiguration", "rv-reversi-operator")]
    assert all(o["apiVersion"] == "flowcontrol.apiserver.k8s.io/v1" for o in objs.values())
    level = objs[("PriorityLevelConfiguration", "rv-reversi-operator")]["spec"]
    assert level == {"type": "Limited", "limited": {
        "nominalConcurrencyShares": 30, "lendablePercent": 0,
        "limitResponse": {"type": "Queue", "queuing": {"queues": 16, "handSize": 4, "queueLengthLimit": 50}}}}
    ours = objs[("FlowSchema", "rv-reversi-operator")]["spec"]
    lease = objs[("FlowSchema", "rv-reversi-leader-election")]["spec"]
    assert ours["priorityLevelConfiguration"] == {"name": "rv-reversi-operator"}
    assert lease["priorityLevelConfiguration"] == {"name": "leader-election"}
    assert ours["distinguisherMethod"] == {"type": "ByUser"}
    # after every suggested system schema, before the one the agents' ServiceAccounts fall into;
    # the Lease schema is matched before the operator's own
    assert LAST_SYSTEM_PRECEDENCE < lease["matchingPrecedence"] < ours["matchingPrecedence"] < \
        SERVICE_ACCOUNTS_PRECEDENCE
    assert (lease["matchingPrecedence"], ours["matchingPrecedence"]) == (950, 1000)


def test_the_operator_schema_selects_exactly_the_operator_and_the_admission_service_accounts(render):
    """Every request of theirs (any resource, any verb, cluster-scoped or not, and non-resource
    URLs), and nobody else's: the agents' ServiceAccounts stay where Kubernetes puts them."""
    objs = render(namespace="reversi-system")
    ours = find(objs, "FlowSchema", "rv-reversi-operator")
    pods = _pods_service_accounts(objs, "reversi-system")
    assert _service_accounts(ours) == {pods["rv-reversi"], pods["rv-reversi-admission"]} == {
        ("reversi-system", "rv-reversi"), ("reversi-system", "rv-reversi-admission")}
    assert {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs if o["kind"] == "ServiceAccount"} \
        == _service_accounts(ours)
    (rule,) = ours["spec"]["rules"]
    assert rule["resourceRules"] == [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"], "namespaces": ["*"],
                                      "clusterScope": True}]
    assert rule["nonResourceRules"] == [{"nonResourceURLs": ["*"], "verbs": ["*"]}]


def test_the_lease_schema_selects_the_operator_lease_requests_only(render):
    """Only the operator (the admission replicas hold no Lease), only leases of the release
    namespace, with every verb its leader-election Role grants."""
    objs = render(namespace="reversi-system")
    lease = find(objs, "FlowSchema", "rv-reversi-leader-election")
    assert _service_accounts(lease) == {("reversi-system", "rv-reversi")}
    (rule,) = lease["spec"]["rules"]
    assert "nonResourceRules" not in rule
    (resources,) = rule["resourceRules"]
    assert (resources["apiGroups"], resources["resources"], resources["namespaces"]) == (
        ["coordination.k8s.io"], ["leases"], ["reversi-system"])
    granted = {verb for r in find(objs, "Role", "rv-reversi-leader-election")["rules"] for verb in r["verbs"]}
    assert set(resources["verbs"]) == granted


def test_the_subjects_follow_the_service_accounts_the_pods_run_as(render):
    named = render({"serviceAccount": {"name": "ops"}}, namespace="ops-system")
    assert _service_accounts(find(named, "FlowSchema", "rv-reversi-operator")) == {
        ("ops-system", "ops"), ("ops-system", "ops-admission")}
    assert _service_accounts(find(named, "FlowSchema", "rv-reversi-leader-election")) == {("ops-system", "ops")}
    # not created by the chart: both Deployments run as the one named (or default), listed once
    shared = render({"serviceAccount": {"create": False, "name": "shared"}}, namespace="ops-system")
    assert set(_pods_service_accounts(shared, "ops-system").values()) == {("ops-system", "shared")}
    assert _service_accounts(find(shared, "FlowSchema", "rv-reversi-operator")) == {("ops-system", "shared")}
    # no webhooks, no admission replicas: the operator alone
    alone = render({"webhook": {"enabled": False}}, namespace="ops-system")
    assert list(_pods_service_accounts(alone, "ops-system")) == ["rv-reversi"]
    assert _service_accounts(find(alone, "FlowSchema", "rv-reversi-operator")) == {("ops-system", "rv-reversi")}


def test_off_switch_renders_none(render):
    assert not _flowcontrol(render({"apiPriorityAndFairness": {"enabled": False}}))


def test_every_value_reaches_the_objects(render):
    objs = _flowcontrol(render({"apiPriorityAndFairness": {
        "priorityLevel": {"nominalConcurrencyShares": 60, "lendablePercent": 10, "borrowingLimitPercent": 50,
                          "queuing": {"queues": 32, "handSize": 8, "queueLengthLimit": 100}},
        "flowSchema": {"matchingPrecedence": 1500},
        "leaderElection": {"matchingPrecedence": 1400, "priorityLevel": "system"}}}))
    limited = objs[("PriorityLevelConfiguration", "rv-reversi-operator")]["spec"]["limited"]
    assert (limited["nominalConcurrencyShares"], limited["lendablePercent"], limited["borrowingLimitPercent"]) == (
        60, 10, 50)
    assert limited["limitResponse"]["queuing"] == {"queues": 32, "handSize": 8, "queueLengthLimit": 100}
    assert objs[("FlowSchema", "rv-reversi-operator")]["spec"]["matchingPrecedence"] == 1500
    lease = objs[("FlowSchema", "rv-reversi-leader-election")]["spec"]
    assert (lease["matchingPrecedence"], lease["priorityLevelConfiguration"]["name"]) == (1400, "system")


def test_a_lease_schema_matched_after_the_operator_schema_is_refused_in_one_line(render):
    error = render.errors({"apiPriorityAndFairness": {"flowSchema": {"matchingPrecedence": 900},
                                                      "leaderElection": {"matchingPrecedence": 900}}})
    assert "apiPriorityAndFairness.leaderElection.matchingPrecedence (900) must be below " \
           "apiPriorityAndFairness.flowSchema.matchingPrecedence (900)" in error


@pytest.mark.parametrize(("values", "error"), [
    ({"flowSchema": {"matchingPrecedence": 10000}}, "/apiPriorityAndFairness/flowSchema/matchingPrecedence"),
    ({"flowSchema": {"matchingPrecedence": 1}}, "/apiPriorityAndFairness/flowSchema/matchingPrecedence"),
    ({"priorityLevel": {"lendablePercent": 101}}, "/apiPriorityAndFairness/priorityLevel/lendablePercent"),
    ({"priorityLevel": {"nominalConcurrencyShares": 0}},
     "/apiPriorityAndFairness/priorityLevel/nominalConcurrencyShares"),
    ({"priorityLevel": {"queuing": {"queues": 0}}}, "/apiPriorityAndFairness/priorityLevel/queuing/queues"),
    ({"leaderElection": {"priorityLevel": "Leader_Election"}},
     "/apiPriorityAndFairness/leaderElection/priorityLevel"),
    ({"flowschema": {}}, "/apiPriorityAndFairness"),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_schema_refuses_bad_values(render, values, error):
    assert error in render.errors({"apiPriorityAndFairness": values})
