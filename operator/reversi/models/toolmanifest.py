"""ToolManifest (namespaced): per tool, how a call is undone and how the undo is checked
(docs/concepts.md#vocabulary).

Example::

    spec:
      runners: [{name: payments-cli, image: registry.example/payments-tools:1.4,
                 command: [payments-tool], envFrom: [{secretRef: {name: payments-api}}]}]
      tools:
      - {name: payments.create_charge, effect: write, idempotencyKey: "$args.order_id",
         compensation: {tool: payments.refund, kind: compensation,
                        args: {charge_id: "$result.id"}, runner: payments-cli}}

Rules (pydantic and CEL): a ``write`` tool needs a compensation; compensation and verification
runners name a runner of this manifest; runner and tool names are unique (list-type map).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from .common import (
    MAX_NAME,
    MAX_REQUIRES,
    MAX_RESIDUE,
    MAX_RUNNERS,
    MAX_TOOLS,
    PRESERVE,
    Condition,
    CrdInfo,
    JSONObject,
    ReversiModel,
    ResidueLine,
    RunnerName,
    StatusModel,
    Text,
    ToolName,
    age_column,
    ready_column,
    list_map,
    rule,
)

Effect = Literal["write", "read", "idempotent", "irreversible"]
CompensationKind = Literal["inverse", "compensation"]

EFFECTS_NEEDING_NO_UNDO = frozenset({"read", "idempotent"})


class Runner(ReversiModel):
    """A container that runs compensator and reader Jobs for some tools."""

    name: RunnerName = Field(
        description="Name of the runner, referenced by compensation.runner and verification.runner."
    )
    image: str = Field(min_length=1, max_length=1024, description="Container image of the compensator/reader.")
    command: list[Text] = Field(
        min_length=1, max_length=64,
        description="Entrypoint of the container; it receives the call JSON (docs/concepts.md#the-job-contract).",
    )
    args: list[Text] = Field(default_factory=list, max_length=256, description="Arguments to the command.")
    env: list[JSONObject] = Field(
        default_factory=list,
        max_length=256,
        description="Environment variables (Kubernetes EnvVar objects); API credentials come from Secrets.",
        json_schema_extra={"items": {"type": "object", **PRESERVE}},
    )
    env_from: list[JSONObject] = Field(
        default_factory=list,
        max_length=64,
        description="Sources of environment variables (Kubernetes EnvFromSource objects), e.g. a secretRef.",
        json_schema_extra={"items": {"type": "object", **PRESERVE}},
    )
    service_account_name: str | None = Field(
        default=None, max_length=MAX_NAME,
        description="Service account the Jobs run as (default: the namespace's default)."
    )
    resources: JSONObject | None = Field(
        default=None, description="Kubernetes ResourceRequirements of the container (requests, limits)."
    )
    deadline_seconds: int = Field(
        default=300, ge=1, le=86400, description="activeDeadlineSeconds of each Job run by this runner."
    )


class Precondition(ReversiModel):
    """What must still hold before the undo runs (the witnessed inverse): a read-only tool whose
    JSON answer must contain ``expect``. When it does not, the step is ``conflict`` and is not
    undone unless the RollbackRequest forces it (``spec.force``, RBAC verb ``force``)."""

    tool: ToolName = Field(description="Read-only tool that reads the current state, e.g. payments.get_charge.")
    args: JSONObject = Field(
        default_factory=dict, description="Argument templates, resolved like the compensation's ($args / $result)."
    )
    expect: JSONObject = Field(
        description="JSON subset the answer must contain for the undo to run, e.g. {refunded: false}."
    )
    runner: RunnerName | None = Field(
        default=None, description="Runner of the reader Job (default: the compensation's runner)."
    )


class Compensation(ReversiModel):
    """The undo of a call: a tool called with argument templates resolved from the original call."""

    tool: ToolName = Field(description="Tool that undoes the call, e.g. payments.refund.")
    kind: CompensationKind = Field(
        description="inverse: restores the exact prior state; "
        "compensation: makes amends, the original stays observable."
    )
    args: JSONObject = Field(
        default_factory=dict,
        description='Argument templates: a string "$args.a.b" or "$result.a.b" is replaced by that value of the '
        "original call; anything else is literal.",
    )
    residue: list[ResidueLine] = Field(
        default_factory=list, max_length=MAX_RESIDUE,
        description="What this undo cannot take back, one statement per line."
    )
    requires_approval: bool = Field(
        default=False, description="The undo waits for approval (RBAC verb approve) before it runs."
    )
    runner: RunnerName = Field(description="Runner (spec.runners[].name) whose container runs the compensator Job.")
    precheck: bool = Field(
        default=False,
        description="Run the tool's verification read before the compensator: when its answer already matches "
        "expect, the step is alreadyRecovered and no compensator runs (needs a verification with a runner).",
    )
    window_seconds: int | None = Field(
        default=None,
        ge=1,
        le=10 * 366 * 86400,
        description="The undo is possible for this many seconds after the step's recordedAt (e.g. refunds within "
        "180 days); later the step is expired and not attempted. Judged when the rollback starts.",
    )
    precondition: Precondition | None = Field(
        default=None,
        description="A read that must still match before the undo runs; otherwise the step is conflict "
        "(not undone unless the RollbackRequest's spec.force names it).",
    )


class Verification(ReversiModel):
    """A read-back after the undo: a read-only tool whose JSON answer must contain expect."""

    tool: ToolName = Field(description="Read-only tool that reads the state back, e.g. payments.get_charge.")
    args: JSONObject = Field(
        default_factory=dict, description="Argument templates, resolved like the compensation's ($args / $result)."
    )
    expect: JSONObject = Field(description="JSON subset the answer must contain, e.g. {refunded: true}.")
    retries: int = Field(default=3, ge=1, le=10, description="Read-backs before the verification fails.")
    backoff_ms: int = Field(
        default=500, ge=1, le=600_000,
        description="Wait before the second read-back, in milliseconds; doubles each time."
    )
    runner: RunnerName | None = Field(
        default=None,
        description="Runner of the reader Job. Without one the undo is reported unverified (never called checked).",
    )


TOOL_RULES = [
    rule(
        "self.effect != 'write' || has(self.compensation)",
        "a write tool needs a compensation (or declare its effect irreversible)",
        fieldPath=".compensation",
    ),
    rule(
        "!has(self.compensation) || !has(self.compensation.precheck) || !self.compensation.precheck || "
        "has(self.verification)",
        "compensation.precheck runs the verification read: declare a verification (with a runner)",
        fieldPath=".compensation.precheck",
    ),
]


class ToolSpec(ReversiModel):
    """One tool's entry: its effect and how a call of it is undone and checked.

    A copy of this entry is kept in each Run step (``snapshot``) when the step is recorded.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": list(TOOL_RULES)})

    name: ToolName = Field(description="Tool name as the automation calls it, e.g. payments.create_charge.")
    effect: Effect = Field(
        description="write: needs an undo; read and idempotent: need none; irreversible: cannot be undone."
    )
    requires: list[ToolName] = Field(
        default_factory=list,
        max_length=MAX_REQUIRES,
        description="Tools whose earlier steps a step of this tool depends on (undone only after this one).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    idempotency_key: str | None = Field(
        default=None,
        max_length=1024,
        description='Forward idempotency key template, e.g. "$args.order_id": a repeat of the same logical call '
        "is refused while the first stands.",
    )
    compensation: Compensation | None = Field(
        default=None, description="How a call is undone (required for write tools)."
    )
    verification: Verification | None = Field(default=None, description="How the undo is checked.")
    residue: list[ResidueLine] = Field(
        default_factory=list,
        max_length=MAX_RESIDUE,
        description="For irreversible tools: what stays after the call, one statement per line.",
    )
    tool_errors: Literal["uncertain", "failed"] | None = Field(
        default=None,
        description=(
            "What a tool error answer (MCP isError) means when reversi-gateway proxies the call: "
            "failed (the server refused, nothing happened) or uncertain (the effect is unknown; the default)."
        ),
    )

    @model_validator(mode="after")
    def _write_needs_compensation(self) -> ToolSpec:
        if self.effect == "write" and self.compensation is None:
            raise ValueError(
                f"tool {self.name}: a write tool needs a compensation (or declare its effect irreversible)"
            )
        if self.compensation is not None and self.compensation.precheck and self.verification is None:
            raise ValueError(
                f"tool {self.name}: compensation.precheck runs the verification read: declare a verification "
                "(with a runner) or drop precheck"
            )
        return self


class ToolManifestSpec(ReversiModel):
    """Tools and the runners that undo and check their calls."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                rule(
                    "!has(self.tools) || self.tools.all(t, !has(t.compensation) || "
                    "(has(self.runners) && self.runners.exists(r, r.name == t.compensation.runner)))",
                    "every compensation.runner must name a runner in spec.runners",
                    fieldPath=".tools",
                ),
                rule(
                    "!has(self.tools) || self.tools.all(t, !has(t.compensation) || "
                    "!has(t.compensation.precondition) || !has(t.compensation.precondition.runner) || "
                    "(has(self.runners) && self.runners.exists(r, r.name == t.compensation.precondition.runner)))",
                    "every compensation.precondition.runner must name a runner in spec.runners",
                    fieldPath=".tools",
                ),
                rule(
                    "!has(self.tools) || self.tools.all(t, !has(t.verification) || !has(t.verification.runner) || "
                    "(has(self.runners) && self.runners.exists(r, r.name == t.verification.runner)))",
                    "every verification.runner must name a runner in spec.runners",
                    fieldPath=".tools",
                ),
            ]
        }
    )

    runners: list[Runner] = Field(
        default_factory=list,
        max_length=MAX_RUNNERS,
        description="Containers that run compensator and reader Jobs, keyed by name.",
        json_schema_extra=list_map("name"),
    )
    tools: list[ToolSpec] = Field(
        default_factory=list,
        max_length=MAX_TOOLS,
        description="Tools keyed by name.",
        json_schema_extra=list_map("name"),
    )

    @model_validator(mode="after")
    def _names_and_references(self) -> ToolManifestSpec:
        problems: list[str] = []
        runner_names: set[str] = set()
        for runner in self.runners:
            if runner.name in runner_names:
                problems.append(f"runner {runner.name!r} is listed twice in spec.runners")
            runner_names.add(runner.name)
        tool_names: set[str] = set()
        for tool in self.tools:
            if tool.name in tool_names:
                problems.append(f"tool {tool.name!r} is listed twice in spec.tools")
            tool_names.add(tool.name)
            if tool.compensation is not None and tool.compensation.runner not in runner_names:
                problems.append(
                    f"tool {tool.name}: compensation.runner {tool.compensation.runner!r} is not in spec.runners; "
                    "add the runner or fix the name"
                )
            pre = tool.compensation.precondition if tool.compensation is not None else None
            if pre is not None and pre.runner is not None and pre.runner not in runner_names:
                problems.append(
                    f"tool {tool.name}: compensation.precondition.runner {pre.runner!r} is not in spec.runners; "
                    "add the runner or fix the name"
                )
            if (
                tool.verification is not None
                and tool.verification.runner is not None
                and tool.verification.runner not in runner_names
            ):
                problems.append(
                    f"tool {tool.name}: verification.runner {tool.verification.runner!r} is not in spec.runners; "
                    "add the runner or fix the name"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def tool(self, name: str) -> ToolSpec | None:
        """The entry of tool ``name`` (or ``None``)."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        return None

    def runner(self, name: str) -> Runner | None:
        """The runner named ``name`` (or ``None``)."""
        for runner in self.runners:
            if runner.name == name:
                return runner
        return None


class ToolManifestStatus(StatusModel):
    """Observed state of a ToolManifest."""

    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation last processed.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Accepted: the manifest is usable; Ready (True when accepted), Reconciling, "
        "Stalled (True when it is not usable).",
        json_schema_extra=list_map("type"),
    )


class ToolManifest(ReversiModel):
    """A whole ToolManifest object (apiVersion, kind, metadata, spec, status)."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["reversi.dev/v1alpha1"] = Field(default="reversi.dev/v1alpha1", description="API version.")
    kind: Literal["ToolManifest"] = Field(default="ToolManifest", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Object metadata.")
    spec: ToolManifestSpec = Field(description="Tools and runners.")
    status: ToolManifestStatus | None = Field(default=None, description="Observed state.")


CRD = CrdInfo(
    kind="ToolManifest",
    plural="toolmanifests",
    singular="toolmanifest",
    short_names=["tm"],
    description="Per tool: its effect, how a call is undone (compensation) and how the undo is checked (verification).",
    spec_model=ToolManifestSpec,
    status_model=ToolManifestStatus,
    printer_columns=[
        {
            "name": "Accepted",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Accepted")].status',
        },
        ready_column(),
        age_column(),
    ],
)
