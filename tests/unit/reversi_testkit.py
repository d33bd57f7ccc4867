"""Builders for engine and model tests: the example objects (order-4711) and small runs."""

from __future__ import annotations

from typing import Any
from collections.abc import Iterable

import yaml

from reversi.models import RunSpec, ToolManifest, ToolSpec

EXAMPLES_YAML = """
apiVersion: reversi.dev/v1alpha1
kind: ToolManifest
metadata: {name: payments, namespace: shop}
spec:
  runners:
  - name: payments-cli
    image: registry.example/payments-tools:1.4
    command: ["payments-tool"]
    envFrom: [{secretRef: {name: payments-api}}]
  tools:
  - name: payments.get_customer
    effect: read
  - name: payments.create_charge
    effect: write
    idempotencyKey: "$args.order_id"
    compensation:
      tool: payments.refund
      kind: compensation
      args: {charge_id: "$result.id", amount: "$args.amount"}
      residue: ["the charge stays visible on the customer's statement"]
      runner: payments-cli
    verification:
      tool: payments.get_charge
      args: {charge_id: "$result.id"}
      expect: {refunded: true}
      retries: 3
      backoffMs: 500
      runner: payments-cli
  - name: payments.capture
    effect: write
    requires: [payments.create_charge]
    compensation: {tool: payments.void_capture, kind: inverse, args: {capture_id: "$result.id"},
                   requiresApproval: true, runner: payments-cli}
  - name: email.send
    effect: irreversible
    residue: ["the customer has read the email"]
---
apiVersion: reversi.dev/v1alpha1
kind: Run
metadata: {name: order-4711, namespace: shop}
spec:
  principal: system:serviceaccount:agents:checkout-agent   # stamped at admission
  mode: enforce
  scope: {actor: checkout-agent, tenant: acme, environment: prod}
  manifestRef: {name: payments}
  steps:
  - {index: 0, tool: payments.get_customer, args: {id: cus_9}, outcome: succeeded, result: {id: cus_9}}
  - {index: 1, tool: payments.create_charge, args: {order_id: o-4711, amount: 700}, outcome: succeeded,
     result: {id: ch_o9}}
  - {index: 2, tool: payments.capture, args: {charge_id: ch_o9}, outcome: uncertain}
  - {index: 3, tool: email.send, args: {to: "customer"}, outcome: succeeded}
---
apiVersion: reversi.dev/v1alpha1
kind: RollbackRequest
metadata: {name: undo-order-4711, namespace: shop}
spec: {runRef: {name: order-4711}, retries: 4, backoff: {baseMs: 200, maxMs: 5000}}
---
apiVersion: reversi.dev/v1alpha1
kind: ClusterHalt
metadata: {name: duplicate-charges}
spec: {reason: "investigating duplicate charges", by: oncall, scope: {tool: "payments.*", actor: checkout-agent}}
"""

RUN_ID = "3f6c1a52-0000-4000-8000-000000004711"


def example_documents() -> list[dict[str, Any]]:
    """The four example objects as dicts (ToolManifest, Run, RollbackRequest, ClusterHalt)."""
    return list(yaml.safe_load_all(EXAMPLES_YAML))


def example_manifest() -> ToolManifest:
    return ToolManifest.model_validate(example_documents()[0])


def example_run_dict(*, with_snapshots: bool = True) -> dict[str, Any]:
    """The example Run with each step's snapshot taken from the example manifest (as admission would)."""
    manifest = example_manifest()
    run = example_documents()[1]
    if with_snapshots:
        for step in run["spec"]["steps"]:
            step["snapshot"] = manifest.spec.tool(step["tool"]).to_wire()
    return run


def example_run_spec(**changes: Any) -> RunSpec:
    run = example_run_dict()
    run["spec"].update(changes)
    return RunSpec.model_validate(run["spec"])


def tool(
    name: str,
    effect: str = "write",
    *,
    requires: Iterable[str] = (),
    comp_tool: str | None = None,
    comp_args: dict[str, Any] | None = None,
    residue: Iterable[str] = (),
    approval: bool = False,
    verify: bool = True,
    reader: bool = True,
) -> dict[str, Any]:
    """A manifest tool entry (wire dict). Write tools get a compensation ``undo-<name>`` with
    args ``{"id": "$result.id"}`` unless told otherwise, and a verification with a reader."""
    entry: dict[str, Any] = {"name": name, "effect": effect, "requires": list(requires)}
    if effect == "write":
        entry["compensation"] = {
            "tool": comp_tool or f"undo-{name}",
            "kind": "inverse",
            "args": comp_args if comp_args is not None else {"id": "$result.id"},
            "residue": list(residue),
            "requiresApproval": approval,
            "runner": "cli",
        }
        if verify:
            entry["verification"] = {
                "tool": f"get-{name}",
                "args": {"id": "$result.id"},
                "expect": {"gone": True},
                **({"runner": "cli"} if reader else {}),
            }
    elif effect == "irreversible":
        entry["residue"] = list(residue)
    return entry


def step(
    index: int,
    snapshot: dict[str, Any] | None,
    outcome: str = "succeeded",
    *,
    tool_name: str | None = None,
    args: dict[str, Any] | None = None,
    result: dict[str, Any] | str | None = "auto",
    depends_on: Iterable[int] = (),
) -> dict[str, Any]:
    """A step (wire dict). ``result="auto"`` gives ``{"id": "r<index>"}`` for succeeded steps."""
    if result == "auto":
        result = {"id": f"r{index}"} if outcome == "succeeded" else None
    entry: dict[str, Any] = {
        "index": index,
        "tool": tool_name or (snapshot["name"] if snapshot else "unknown.tool"),
        "args": args if args is not None else {"n": index},
        "outcome": outcome,
        "dependsOn": list(depends_on),
    }
    if result is not None:
        entry["result"] = result
    if snapshot is not None:
        entry["snapshot"] = snapshot
    return entry


def run_spec(steps: list[dict[str, Any]], resolutions: Iterable[dict[str, Any]] = (), mode: str = "enforce") -> RunSpec:
    return RunSpec.model_validate(
        {"mode": mode, "manifestRef": {"name": "m"}, "steps": steps, "resolutions": list(resolutions)}
    )


def snapshot(entry: dict[str, Any]) -> dict[str, Any]:
    """Validate a tool entry the way a snapshot is validated and return its wire form."""
    return ToolSpec.model_validate(entry).to_wire()
