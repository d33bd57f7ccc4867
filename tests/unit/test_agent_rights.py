"""An agent's rights are written once (docs/operations.md#an-agents-rights): the chart's roles,
the demos' agents and the docs' table are all reversi.rbac's rules."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
import yaml

from reversi import crdgen, rbac

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _flat(rules) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.mark.parametrize("module", ["demo.run_demo", "demo.mcp_demo"])
def test_the_demos_agent_holds_exactly_the_record_rights(module):
    demo = importlib.import_module(module)
    assert demo.ROLES["checkout-agent"] == [dict(r) for r in rbac.RECORD]


def test_the_charts_agent_roles_are_generated_from_the_one_definition():
    """The committed template is what reversi-crdgen renders (make crds), and each ClusterRole in
    it carries the rules of its set, nothing more."""
    path = ROOT / "charts/reversi/templates/agent-roles.yaml"
    assert path.read_text() == crdgen.agent_roles_template(), "agent-roles.yaml is stale: run make crds"
    bodies = [yaml.safe_load("\n".join(line for line in doc.splitlines() if "{{" not in line))
              for doc in path.read_text().split("\n---\n")]
    assert [b["rules"] for b in bodies] == [[dict(r) for r in rules] for rules in rbac.CLUSTER_ROLES.values()]


def test_the_docs_table_is_the_one_definition():
    text = (ROOT / "docs/operations.md").read_text()
    section = text.split("### An agent's rights", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("| `<fullname>-")]
    rows = re.findall(r"^\| `<fullname>-(\w+)` \| ([\w.]+) \| (\w+) \| ([\w, ]+) \|", section, re.M)
    assert len(rows) == len(table), "a row of the table does not read role | group | resource | verbs"
    documented: dict[str, set[tuple[str, str, str]]] = {}
    for role, group, resource, verbs in rows:
        documented.setdefault(role, set()).update((group, resource, v.strip()) for v in verbs.split(","))
    assert documented == {name: _flat(rules) for name, rules in rbac.CLUSTER_ROLES.items()}


def test_record_never_lists_or_deletes_the_journal():
    """An agent with -record cannot erase its own journal, nor read other runs wholesale, nor
    roll back: that is -recover's."""
    record = _flat(rbac.RECORD)
    for resource in ("runs", "runsteps"):
        for verb in ("list", "watch", "delete", "deletecollection", "update"):
            assert (rbac.GROUP, resource, verb) not in record
    assert (rbac.GROUP, "rollbackrequests", "create") not in record
    assert (rbac.GROUP, "rollbackrequests", "create") in _flat(rbac.RECOVER)


def _forbidden(message: str):
    import json

    from kubernetes.client.rest import ApiException

    err = ApiException(status=403, reason="Forbidden")
    err.body = json.dumps({"kind": "Status", "message": message, "reason": "Forbidden"})
    return err


def test_an_rbac_refusal_names_the_role_to_grant_and_a_rule_refusal_stays_what_it_is():
    """The SDK tells the authorizer's refusal (NotPermitted: grant <fullname>-record, or for a
    rollback from code <fullname>-recover) from an admission rule's, whatever a halt's reason says."""
    from reversi import sdk

    rbac_message = ('leases.coordination.k8s.io is forbidden: User "checkout-agent" cannot create resource "leases" '
                    'in API group "coordination.k8s.io" in the namespace "shop"')
    refused = sdk._refusal(_forbidden(rbac_message), "claiming the key")
    assert isinstance(refused, sdk.NotPermitted) and "<fullname>-record" in str(refused)
    rollback = sdk._refusal(_forbidden(rbac_message.replace("leases", "rollbackrequests")), "rolling back",
                            advice=sdk.RECOVER_ADVICE)
    assert "<fullname>-recover" in str(rollback) and "kubectl reversi rollback" in str(rollback)
    halt = sdk._refusal(_forbidden("kill switch: agents cannot touch resource quotas today (Halt shop/stop refuses "
                                   "step 3, payments.refund; deleting the halt lifts it)"), "recording")
    assert type(halt) is sdk.Halted
