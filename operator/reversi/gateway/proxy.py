"""The MCP server the agent talks to: every ``tools/call`` recorded, then forwarded upstream.

The rule for one ``tools/call`` (rules 9 and 10; docs/gateway.md#what-happens-to-one-call):

1. who is calling (the TokenReview'd service account, or the gateway itself for stdio) and in
   which Run (``Reversi-Run-Id``, else the MCP session, else ``--run``);
2. the step is recorded ``intended`` through :meth:`reversi.sdk.Recorder.begin`, *before* the
   upstream sees the call. A refusal (``kill switch: …``, ``belongs to another principal``, a
   tool with no manifest entry, a duplicate) comes back as an MCP tool error with the same
   message, and the call is not forwarded;
3. the call is forwarded; its answer is recorded with :meth:`reversi.sdk.Recorder.finish`:
   ``succeeded`` (structured content, else the text parsed as JSON, is the result), ``failed``
   (a tool error answer, only when the manifest entry says ``toolErrors: failed``), else
   ``uncertain`` (a tool error, a timeout, a dropped connection, a cancelled call);
4. the agent gets the upstream's answer, with ``_meta`` ``reversi.dev/run``, ``reversi.dev/step``
   and ``reversi.dev/outcome`` added.

A step's ``dependsOn`` comes from the request's ``_meta["reversi.dev/dependsOn"]`` (indices).
"""

from __future__ import annotations

import json
import logging
import threading
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast
from collections.abc import AsyncIterator

import anyio
import mcp_types as types
from kubernetes import client
from kubernetes.client.rest import ApiException
from mcp.server import Server
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..adapters import apicalls
from ..adapters.apicalls import api_message
from ..models.toolmanifest import ToolManifestSpec
from ..sdk import OutcomeNotRecorded, Recorder, RecordingRefused, Step
from . import calls
from .identity import Agent, TokenReviewer, Unauthenticated, impersonating
from .settings import GatewaySettings
from .upstream import Upstream, UpstreamUnavailable
from .. import __version__

log = logging.getLogger("reversi.gateway")

AGENT_SCOPE_KEY = "reversi.agent"
OPERATOR_PATH = "/operator/mcp"
_RESERVED_META = ("io.modelcontextprotocol/", "reversi.dev/")


def refusal(message: str, reason: str = "Refused") -> types.CallToolResult:
    """The MCP tool error an agent gets for a call that was not made."""
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True,
                                meta={"reversi.dev/refused": reason})


class Gateway:
    """Records and forwards tool calls. Build the MCP server with :meth:`server`; serve it
    with :meth:`http_app` (agents authenticate with a token) or over stdio (see ``main``)."""

    def __init__(self, settings: GatewaySettings, cfg: client.Configuration, upstream: Upstream,
                 reviewer: TokenReviewer | None = None):
        self.settings = settings
        self.cfg = cfg
        self.upstream = upstream
        self.reviewer = reviewer
        self._apis: dict[str, client.ApiClient] = {}
        self._recorders: dict[tuple[str, str, str], Recorder] = {}
        self._lock = threading.Lock()

    # ----- the MCP server -----------------------------------------------------------------

    def server(self) -> Server:
        """The low-level MCP server: ``tools/list`` passes through, ``tools/call`` is recorded."""

        @asynccontextmanager
        async def lifespan(_server: Server) -> AsyncIterator[dict]:
            async with anyio.create_task_group() as tg:
                await tg.start(self.upstream.run)
                yield {}
                tg.cancel_scope.cancel()

        return Server("reversi-gateway", version=__version__, lifespan=lifespan,
                      instructions="Every tool call is recorded in a Reversi Run before it is forwarded.",
                      on_list_tools=self.list_tools, on_call_tool=self.call_tool)

    def http_app(self) -> Any:
        """The ASGI app: the agents' endpoint at ``settings.path``, ``/healthz``, and with
        ``operator_tools`` the operator endpoint at ``/operator/mcp``; behind token review
        when ``settings.identity`` is ``token``."""
        async def healthz(_request: Request) -> JSONResponse:
            ok = self.upstream.connected
            return JSONResponse({"upstream": "connected" if ok else "unreachable"}, status_code=200 if ok else 503)

        s = self.settings
        agents = self.server().streamable_http_app(streamable_http_path=s.path, host=s.host,
                                                   json_response=not s.sse_responses)
        apps = [agents]
        routes: list[Any] = [Route("/healthz", healthz)]
        protected = [s.path]
        if s.operator_tools:
            from .operator_tools import OperatorTools

            tools = OperatorTools(self.cfg, self._agent_required, self._namespace)
            ops = tools.server().streamable_http_app(streamable_http_path=OPERATOR_PATH, host=s.host,
                                                     json_response=not s.sse_responses)
            apps.append(ops)
            routes.append(_mcp_route(ops, OPERATOR_PATH))
            protected.append(OPERATOR_PATH)
        routes.append(_mcp_route(agents, s.path))

        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            async with AsyncExitStack() as stack:
                for app in apps:
                    await stack.enter_async_context(app.router.lifespan_context(app))
                yield

        app = Starlette(routes=routes, lifespan=lifespan)
        if s.identity == "token":
            assert self.reviewer is not None, "identity 'token' needs a TokenReviewer"
            return TokenAuth(app, self.reviewer, tuple(protected))
        return app

    # ----- handlers -----------------------------------------------------------------------

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        """The upstream's tools; only those with a manifest entry when ``filter_tools`` is on
        (enforce mode)."""
        try:
            upstream = await self.upstream.client()
        except UpstreamUnavailable as err:
            raise MCPError(types.INTERNAL_ERROR, str(err)) from None
        try:
            listed = await upstream.list_tools(cursor=params.cursor if params else None)
        except MCPError:
            raise
        except Exception as err:  # noqa: BLE001 - the connection broke: reconnect, say so
            self.upstream.broken(upstream)
            raise MCPError(types.INTERNAL_ERROR,
                           f"upstream {self.upstream.describe}: {type(err).__name__}: {err}") from None
        tools = listed.tools
        if self.settings.filter_tools and self.settings.mode == "enforce":
            try:
                agent = self._agent(ctx)
                namespace = self._namespace(agent)
                names = await anyio.to_thread.run_sync(self._manifest_tools, agent, namespace)
            except (calls.CallRefused, ApiException) as err:
                raise MCPError(types.INVALID_REQUEST, _text(err)) from None
            keep = set(calls.visible_tools([t.name for t in tools], names, self.settings.tool_map))
            tools = [t for t in tools if t.name in keep]
        return types.ListToolsResult(tools=tools, next_cursor=listed.next_cursor)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        """Record, forward, record the outcome (see the module's rule)."""
        name, args = params.name, dict(params.arguments or {})
        tool = calls.manifest_tool(name, self.settings.tool_map)
        try:
            agent = self._agent(ctx)
            namespace = self._namespace(agent)
            run = calls.run_name(_headers(ctx), self.settings.run)
            deps = calls.depends_on(ctx.meta)
            upstream = await self.upstream.client()
            rec = self._cached_recorder(agent, namespace, run)
            if rec is None:
                rec = await anyio.to_thread.run_sync(self._recorder, agent, namespace, run)
            step, tool_errors = await anyio.to_thread.run_sync(self._begin, rec, tool, args, deps)
        except RecordingRefused as err:
            if err.status == 404:  # the Run is gone: the next call creates it again
                with self._lock:
                    self._recorders.pop((agent.username if agent else "", namespace, run), None)
            log.info("refused %s in Run %s: %s", tool, _where(ctx, self), err.message)
            return refusal(err.message, err.reason or type(err).__name__)
        except (calls.CallRefused, UpstreamUnavailable) as err:
            return refusal(str(err), type(err).__name__)
        except Exception as err:  # noqa: BLE001 - the API server refused or is unreachable
            return refusal(f"cannot record {tool}: {_text(err)}; the call was not made", "RecordingFailed")
        where = f"step {step.index} of Run {namespace}/{run}"
        try:
            result = await upstream.call_tool(name, args, read_timeout_seconds=self.settings.call_timeout_seconds,
                                              meta=_forwarded_meta(ctx.meta))
        except BaseException as err:  # every way a made call can end without an answer
            if not isinstance(err, MCPError):
                self.upstream.broken(upstream)
            outcome = calls.outcome_of_exception(err)
            with anyio.CancelScope(shield=True):
                warning = await self._finish(rec, step, outcome)
            if not isinstance(err, Exception):
                raise  # cancelled: the agent is gone
            if isinstance(err, MCPError) and err.code != types.REQUEST_TIMEOUT:
                raise  # the upstream's protocol error, as it sent it (the step is uncertain)
            text = (f"{name}: {outcome.error}; the effect is unknown: recorded uncertain as {where}"
                    + (f" ({warning})" if warning else ""))
            return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True,
                                        meta=self._meta(run, step, "uncertain", warning))
        value = calls.answer_json(result.structured_content,
                                  [c.text for c in result.content if isinstance(c, types.TextContent)])
        outcome = calls.outcome_of(result.is_error, value, tool_errors)
        warning = await self._finish(rec, step, outcome)
        result.meta = {**(result.meta or {}), **self._meta(run, step, outcome.outcome, warning)}
        return result

    # ----- helpers ------------------------------------------------------------------------

    async def _finish(self, rec: Recorder, step: Step, outcome: calls.Outcome) -> str | None:
        """Record the outcome; a failure to record is returned as a warning (the call was made)."""
        try:
            await anyio.to_thread.run_sync(
                lambda: rec.finish(step, outcome.outcome, result=outcome.result, error=outcome.error))
        except OutcomeNotRecorded as err:
            log.error("%s", err.message)
            return err.message
        except Exception as err:  # noqa: BLE001 - the API server is unreachable: same consequence
            message = (f"the outcome of step {step.index} could not be recorded ({_text(err)}); the call was made, "
                       "and the step stays intended (settle it with a resolution)")
            log.error("%s", message)
            return message
        return None

    def _meta(self, run: str, step: Step, outcome: str, warning: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {calls.META_RUN: run, calls.META_STEP: step.index, calls.META_OUTCOME: outcome}
        if warning:
            meta[calls.META_WARNING] = warning
        return meta

    def _agent(self, ctx: Any) -> Agent | None:
        if self.settings.identity == "self":
            return None
        request = getattr(ctx, "request", None)
        agent = request.scope.get(AGENT_SCOPE_KEY) if request is not None else None
        if agent is None:
            raise calls.CallRefused("no authenticated agent: connect over HTTP with a service-account token")
        return agent

    def _agent_required(self, ctx: Any) -> Agent:
        agent = self._agent(ctx)
        if agent is None:
            raise calls.CallRefused("the operator tools need an authenticated caller (identity 'token')")
        return agent

    def _namespace(self, agent: Agent | None) -> str:
        namespace = self.settings.namespace or (calls.principal_namespace(agent.username) if agent else None)
        if not namespace:
            who = agent.username if agent else "the gateway"
            raise calls.CallRefused(f"no namespace for the runs of {who}: set the gateway's --namespace "
                                    "(only service-account tokens name their own namespace)")
        return namespace

    def _api(self, agent: Agent | None) -> client.ApiClient:
        key = agent.username if agent else ""
        with self._lock:
            if key not in self._apis:
                self._apis[key] = impersonating(self.cfg, agent)
            return self._apis[key]

    def _cached_recorder(self, agent: Agent | None, namespace: str, run: str) -> Recorder | None:
        with self._lock:
            return self._recorders.get((agent.username if agent else "", namespace, run))

    def _recorder(self, agent: Agent | None, namespace: str, run: str) -> Recorder:
        """The recorder of ``namespace/run`` for this agent: the Run is created or continued once."""
        key = (agent.username if agent else "", namespace, run)
        with self._lock:
            rec = self._recorders.get(key)
        if rec is None:
            who = calls.principal_short_name(agent.username) if agent else "gateway"
            rec = Recorder.open(namespace, run, manifest=self.settings.manifest, mode=self.settings.mode,
                                scope=self.settings.scope(who), api=self._api(agent))
            with self._lock:
                if len(self._recorders) > 10_000:
                    self._recorders.clear()
                rec = self._recorders.setdefault(key, rec)
        return rec

    @staticmethod
    def _begin(rec: Recorder, tool: str, args: dict, deps: list[int] | None) -> tuple[Step, str | None]:
        """Record ``intended`` (blocking); the step, and what a tool error of ``tool`` means
        (its manifest entry's ``toolErrors``, read once per recorder)."""
        step = rec.begin(tool, args, deps)
        manifest = rec.manifest()
        spec = manifest.tool(tool) if manifest else None
        return step, (spec.tool_errors if spec is not None else None)

    def _manifest_tools(self, agent: Agent | None, namespace: str) -> set[str]:
        obj = apicalls.read(client.CustomObjectsApi(self._api(agent)), "toolmanifests", self.settings.manifest,
                            namespace)
        return {t.name for t in ToolManifestSpec.model_validate(obj["spec"]).tools}


class TokenAuth:
    """ASGI middleware: requests under ``paths`` need a bearer token the API server accepts
    (TokenReview); the agent is put in the ASGI scope for the handlers. Others get HTTP 401."""

    def __init__(self, app: Any, reviewer: TokenReviewer, paths: tuple[str, ...]):
        self.app, self.reviewer, self.paths = app, reviewer, paths

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.paths):
            authorization = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == b"authorization"),
                                 None)
            try:
                agent = self.reviewer.cached(authorization) if authorization else None
                if agent is None:
                    agent = await anyio.to_thread.run_sync(self.reviewer.review, authorization)
            except Unauthenticated as err:
                await _reply(send, 401, {"error": "unauthenticated", "message": str(err)},
                             [(b"www-authenticate", b'Bearer realm="reversi-gateway"')])
                return
            except Exception as err:  # noqa: BLE001 - the API server did not answer
                await _reply(send, 503, {"error": "unavailable", "message": f"cannot review the token: {_text(err)}"})
                return
            scope = {**scope, AGENT_SCOPE_KEY: agent}
        await self.app(scope, receive, send)


async def _reply(send: Any, status: int, body: dict, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


def _mcp_route(app: Starlette, path: str) -> Route:
    """The MCP endpoint route of an SDK-built app, to serve it in the gateway's own app."""
    return next(r for r in app.router.routes if isinstance(r, Route) and r.path == path)


def _headers(ctx: Any) -> dict[str, str]:
    request = getattr(ctx, "request", None)
    return {k.lower(): v for k, v in request.headers.items()} if request is not None else {}


def _forwarded_meta(meta: Any) -> types.RequestParamsMeta | None:
    """The agent's own ``_meta`` entries (not the protocol's, not Reversi's) go upstream
    (``_meta`` takes any keys; the SDK's ``RequestParamsMeta`` type names only progressToken)."""
    if not meta:
        return None
    out = {k: v for k, v in dict(meta).items() if not k.startswith(_RESERVED_META) and k != "progressToken"}
    return cast(types.RequestParamsMeta, out) if out else None


def _text(err: BaseException) -> str:
    return api_message(err) if isinstance(err, ApiException) else str(err)


def _where(ctx: Any, gw: Gateway) -> str:
    try:
        return calls.run_name(_headers(ctx), gw.settings.run)
    except calls.CallRefused:
        return "?"
