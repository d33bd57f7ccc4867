"""Every knob of reversi-gateway in one typed object.

Read from ``REVERSI_GATEWAY_*`` environment variables (``REVERSI_GATEWAY_UPSTREAM_URL=...``,
``REVERSI_GATEWAY_TOOL_MAP='{"charge": "payments.create_charge"}'``); the command's flags
override them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """Gateway settings. Times in seconds."""

    model_config = SettingsConfigDict(env_prefix="REVERSI_GATEWAY_", extra="ignore")

    upstream_url: str | None = Field(None,
                                     description="Upstream MCP server, streamable HTTP URL (or upstream_command).")
    upstream_command: list[str] = Field(
        default_factory=list, description="Upstream MCP server started as a stdio subprocess: command and arguments.")
    listen: Literal["http", "stdio"] = Field("http", description="How the agent reaches the gateway.")
    host: str = Field("0.0.0.0", description="HTTP address to listen on.")
    port: int = Field(8090, ge=0, le=65535, description="HTTP port (0: any free port, printed at start).")
    path: str = Field("/mcp", description="HTTP path of the MCP endpoint.")
    sse_responses: bool = Field(
        False, description="Answer POSTs as SSE streams instead of single JSON responses (JSON is one write "
        "per answer and a little faster; SSE lets notifications flow during a call).")
    kubeconfig: str | None = Field(None,
                                   description="The gateway's own credentials (default: in-cluster, then $KUBECONFIG).")
    identity: Literal["token", "self"] = Field(
        "token", description="token: the agent sends a service-account token (TokenReview) and runs are written "
        "impersonating it; self: runs are written as the gateway's own identity (stdio, local use).")
    audiences: list[str] = Field(default_factory=list,
                                 description="Audiences the agent's token must carry (TokenReview).")
    token_cache_seconds: float = Field(60.0, ge=0, le=3600, description="How long a reviewed token is trusted.")
    namespace: str | None = Field(
        None, description="Namespace of the Runs (default: the agent's service-account namespace).")
    manifest: str = Field(..., min_length=1, description="ToolManifest (in the Run's namespace) that new runs name.")
    mode: Literal["enforce", "observe"] = Field("enforce", description="Mode of new runs.")
    tenant: str | None = Field(None, description="scope.tenant of new runs.")
    environment: str | None = Field(None, description="scope.environment of new runs.")
    actor: str | None = Field(None, description="scope.actor of new runs (default: the agent's name).")
    run: str | None = Field(None, description="Run name when the agent names none and has no MCP session (stdio).")
    tool_map: dict[str, str] = Field(
        default_factory=dict, description="MCP tool name -> manifest tool name, where they differ.")
    filter_tools: bool = Field(
        False, description="tools/list shows only tools with a manifest entry (enforce mode only).")
    operator_tools: bool = Field(
        False, description="Also serve reversi.plan_rollback and reversi.request_rollback at /operator/mcp "
        "(identity token only; each call impersonates the caller, user and groups).")
    call_timeout_seconds: float = Field(
        30.0, gt=0, le=3600, description="How long a proxied call may take; then it is recorded uncertain.")
    connect_timeout_seconds: float = Field(10.0, gt=0, le=600, description="How long to wait for the upstream.")

    @model_validator(mode="after")
    def _one_upstream(self) -> GatewaySettings:
        if bool(self.upstream_url) == bool(self.upstream_command):
            raise ValueError("set exactly one upstream: upstream_url (streamable HTTP) or upstream_command (stdio)")
        if self.listen == "stdio" and self.identity != "self":
            raise ValueError("over stdio there is no token to review: use identity 'self' (runs are written with "
                             "the gateway's own kubeconfig) and give namespace and run")
        if self.listen == "http" and self.identity == "self" and self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("identity 'self' over HTTP is for loopback only: set host 127.0.0.1, "
                             "or use identity 'token'")
        if self.operator_tools and self.identity != "token":
            raise ValueError("operator_tools needs identity 'token': every operator call acts as its caller")
        return self

    def scope(self, agent: str) -> dict[str, str]:
        """``spec.scope`` of a new run for the agent named ``agent``."""
        out = {"actor": self.actor or agent}
        if self.tenant:
            out["tenant"] = self.tenant
        if self.environment:
            out["environment"] = self.environment
        return out
