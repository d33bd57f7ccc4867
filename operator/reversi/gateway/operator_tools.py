"""Operator tools over MCP: plan and request a rollback, as the caller.

Served at ``/operator/mcp`` when the gateway runs with ``--operator-tools``; authenticated on
its own (the caller's token, TokenReview), and every API call impersonates the caller (user and
groups), so RBAC decides exactly as for ``kubectl reversi``:

- ``reversi.plan_rollback(run, namespace?)``: creates a dry-run RollbackRequest and returns its
  plan once the operator has written it (``{"request", "phase", "fullyReversible", "plan"}``);
  needs ``create`` on rollbackrequests.
- ``reversi.request_rollback(run, confirm, namespace?)``: with ``confirm: true`` creates a
  RollbackRequest and returns ``{"request", "namespace"}``; without it, nothing is done and the
  answer says how to confirm.

The namespace defaults to the gateway's ``--namespace``, else the caller's service-account
namespace.
"""

from __future__ import annotations

import json
import secrets
import string
from typing import Any

import anyio
import mcp_types as types
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from mcp.server import Server

from ..adapters import apicalls as calls_api
from ..adapters.apicalls import api_message
from . import calls
from .identity import Agent, impersonating_with_groups
from .. import __version__

G, V = calls_api.GROUP, calls_api.VERSION
PLAN_TIMEOUT = 30.0
#: Seconds any one API call may take before it is abandoned.
API_TIMEOUT = calls_api.TIMEOUT
FINAL_OR_PLANNED = ("Planned", "Succeeded", "Incomplete", "Failed")

TOOLS = [
    types.Tool(name="reversi.plan_rollback",
               description="What undoing a Run would do (a dry-run RollbackRequest): per step compensate, skip, "
                           "unrecoverable, unresolved, deferred; and whether it is fully reversible.",
               input_schema={"type": "object", "required": ["run"], "properties": {
                   "run": {"type": "string"}, "namespace": {"type": "string"}}}),
    types.Tool(name="reversi.request_rollback",
               description="Undo a Run: creates a RollbackRequest. Needs confirm: true.",
               input_schema={"type": "object", "required": ["run", "confirm"], "properties": {
                   "run": {"type": "string"}, "confirm": {"type": "boolean"}, "namespace": {"type": "string"}}}),
]


def request_name(run: str, kind: str) -> str:
    """``<run>-<kind>-<5 random characters>``, a valid object name."""
    suffix = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(5))
    return f"{run[: 253 - len(kind) - 8].rstrip('-.')}-{kind}-{suffix}"


def request_body(run: str, name: str, dry_run: bool) -> dict[str, Any]:
    """The RollbackRequest the tools create."""
    return {"apiVersion": f"{G}/{V}", "kind": "RollbackRequest",
            "metadata": {"name": name, "labels": {"reversi.dev/created-by": "reversi-gateway"}},
            "spec": {"runRef": {"name": run}, "dryRun": dry_run}}


class OperatorTools:
    """The operator endpoint's MCP server; ``agent_of(ctx)`` and ``namespace_of(agent)`` come
    from the gateway (same identity rules)."""

    def __init__(self, cfg: client.Configuration, agent_of: Any, namespace_of: Any):
        self.cfg, self.agent_of, self.namespace_of = cfg, agent_of, namespace_of

    def server(self) -> Server:
        async def list_tools(_ctx: Any, _params: Any) -> types.ListToolsResult:
            return types.ListToolsResult(tools=TOOLS)

        return Server("reversi-operator-tools", version=__version__, on_list_tools=list_tools,
                      on_call_tool=self.call_tool)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = dict(params.arguments or {})
        try:
            agent = self.agent_of(ctx)
            run = args.get("run")
            if not isinstance(run, str) or not run:
                raise calls.CallRefused(f"{params.name}: give the run's name as 'run'")
            namespace = args.get("namespace") or self.namespace_of(agent)
            if params.name == "reversi.plan_rollback":
                answer = await anyio.to_thread.run_sync(self.plan, agent, namespace, run)
            elif params.name == "reversi.request_rollback":
                if args.get("confirm") is not True:
                    raise calls.CallRefused(f"nothing done: undoing Run {namespace}/{run} needs confirm: true "
                                            "(look at reversi.plan_rollback first)")
                answer = await anyio.to_thread.run_sync(self.request, agent, namespace, run)
            else:
                raise calls.CallRefused(f"unknown tool {params.name!r}")
        except calls.CallRefused as err:
            return _error(str(err))
        except ApiException as err:
            return _error(f"{params.name}: {api_message(err)}")
        return types.CallToolResult(content=[types.TextContent(text=json.dumps(answer))], structured_content=answer)

    def _custom(self, agent: Agent) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(impersonating_with_groups(self.cfg, agent))

    def request(self, agent: Agent, namespace: str, run: str) -> dict[str, Any]:
        """Create the RollbackRequest as ``agent``; ``{"request", "namespace"}``."""
        custom = self._custom(agent)
        calls_api.read(custom, "runs", run, namespace, timeout=API_TIMEOUT)  # a clear "not found" first
        name = request_name(run, "undo")
        # a random name: repeated only when it surely did not land (never two rollbacks)
        calls_api.create(custom, "rollbackrequests", request_body(run, name, False), namespace, timeout=API_TIMEOUT)
        return {"request": name, "namespace": namespace}

    def plan(self, agent: Agent, namespace: str, run: str, timeout: float = PLAN_TIMEOUT) -> dict[str, Any]:
        """Create a dry run as ``agent`` and wait (watch) until its plan is written."""
        custom = self._custom(agent)
        calls_api.read(custom, "runs", run, namespace, timeout=API_TIMEOUT)
        name = request_name(run, "plan")
        created = calls_api.create(custom, "rollbackrequests", request_body(run, name, True), namespace,
                                   timeout=API_TIMEOUT)
        assert created is not None  # without exists_ok a 409 raises
        obj = created
        if _phase(obj) not in FINAL_OR_PLANNED:
            w = watch.Watch()
            for event in w.stream(custom.list_namespaced_custom_object, G, V, namespace, "rollbackrequests",
                                  field_selector=f"metadata.name={name}",
                                  resource_version=created["metadata"]["resourceVersion"],
                                  timeout_seconds=int(timeout), _request_timeout=timeout + 15):
                obj = event["object"]
                if _phase(obj) in FINAL_OR_PLANNED:
                    w.stop()
                    break
        status = obj.get("status") or {}
        if _phase(obj) not in FINAL_OR_PLANNED:
            raise calls.CallRefused(f"RollbackRequest {namespace}/{name} has no plan after {timeout:.0f}s "
                                    f"(phase {_phase(obj) or 'none'}): is the operator running?")
        plan = status.get("plan") or {}
        return {"request": name, "phase": _phase(obj), "fullyReversible": plan.get("fullyReversible"), "plan": plan}


def _phase(obj: dict) -> str | None:
    return (obj.get("status") or {}).get("phase")


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)
