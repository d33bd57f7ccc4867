r"""Halt (namespaced) and ClusterHalt (cluster): stop *new* calls, never a rollback (DESIGN §3, rule 9).

``scope`` holds globs; a call must match every field named; no scope (or an empty one) halts
everything in reach. Lifting a halt is deleting it.

Glob semantics (defined here, once — :func:`glob_match`): a pattern matches the whole value,
case-sensitively; ``*`` matches any run of characters, empty included, **including ``.`` and
``/``** (``payments.*`` matches ``payments.refund`` and ``payments.v2/charge``; ``*`` matches
everything); ``?`` matches exactly one character; ``\`` makes the next character literal
(``\*`` is a star); every other character, ``.``, ``/`` and ``[`` included, stands for itself
(there are no character classes).
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any, Literal

from pydantic import ConfigDict, Field

from .common import (
    MAX_CONDITIONS,
    MAX_NAME,
    MAX_TEXT,
    Condition,
    CrdInfo,
    ReversiModel,
    StatusModel,
    age_column,
    ready_column,
)

Glob = str


@lru_cache(maxsize=1024)
def _glob_tokens(pattern: str) -> tuple[str | None, ...]:
    """The pattern as tokens: ``None`` for ``*``, ``""`` for ``?``, else one literal character."""
    tokens: list[str | None] = []
    escaped = False
    for ch in pattern:
        if escaped:
            tokens.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "*":
            if not tokens or tokens[-1] is not None:  # "**" is "*"
                tokens.append(None)
        elif ch == "?":
            tokens.append("")
        else:
            tokens.append(ch)
    if escaped:  # a trailing backslash stands for itself
        tokens.append("\\")
    return tuple(tokens)


def glob_match(pattern: str, value: str) -> bool:
    """Whether ``value`` matches the halt glob ``pattern`` (semantics in the module docstring).

    Iterative matching with one remembered ``*``: at most len(pattern) x len(value) steps, never
    the exponential backtracking of a regular expression (a halt pattern is user input).
    """
    tokens = _glob_tokens(pattern)
    t = v = 0
    star_t, star_v = -1, 0
    while v < len(value):
        if t < len(tokens) and tokens[t] is not None and (tokens[t] == "" or tokens[t] == value[v]):
            t += 1
            v += 1
        elif t < len(tokens) and tokens[t] is None:
            star_t, star_v = t, v
            t += 1
        elif star_t >= 0:
            star_v += 1
            t, v = star_t + 1, star_v
        else:
            return False
    while t < len(tokens) and tokens[t] is None:
        t += 1
    return t == len(tokens)


class HaltScope(ReversiModel):
    """Which calls a Halt refuses: globs over tool, actor, tenant, environment; all named must match."""

    tool: Glob | None = Field(default=None, max_length=MAX_NAME, description='Glob over the tool name, e.g. "payments.*".')
    actor: Glob | None = Field(default=None, max_length=MAX_NAME, description="Glob over the run's scope.actor.")
    tenant: Glob | None = Field(default=None, max_length=MAX_NAME, description="Glob over the run's scope.tenant.")
    environment: Glob | None = Field(
        default=None, max_length=MAX_NAME, description="Glob over the run's scope.environment."
    )

    def matches(self, **call: str | None) -> bool:
        """Whether a call matches every field named in this scope.

        ``call`` holds ``tool``, ``actor``, ``tenant``, ``environment`` (and ``namespace`` for a
        ClusterHalt); a named field with no value in the call does not match.
        """
        for field, pattern in self.model_dump(exclude_none=True).items():
            value = call.get(field)
            if value is None or not glob_match(pattern, value):
                return False
        return True


class ClusterHaltScope(HaltScope):
    """A HaltScope that also names namespaces."""

    namespace: Glob | None = Field(default=None, max_length=MAX_NAME, description="Glob over the run's namespace.")


class HaltSpec(ReversiModel):
    """Why calls are stopped, by whom, and which."""

    reason: str = Field(
        min_length=1, max_length=MAX_TEXT, description='Why; refused calls get "kill switch: <reason>".'
    )
    by: str | None = Field(default=None, max_length=MAX_NAME, description="Who halted, e.g. oncall.")
    scope: HaltScope | None = Field(default=None, description="Which calls; none halts every call in the namespace.")


class ClusterHaltSpec(HaltSpec):
    """Why calls are stopped cluster-wide, by whom, and which."""

    scope: ClusterHaltScope | None = Field(default=None, description="Which calls; none halts every call in the cluster.")


class HaltStatus(StatusModel):
    """Observed state of a Halt or ClusterHalt."""

    observed_generation: int | None = Field(default=None, ge=0, description="metadata.generation last processed.")
    active: bool = Field(default=False, description="The halt is in effect.")
    since: datetime | None = Field(default=None, description="When the halt took effect.")
    refused_calls: int = Field(default=0, ge=0, description="Calls refused by this halt.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Active; Ready, Reconciling, Stalled (kstatus: Ready is True while the halt is in force).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )


class Halt(ReversiModel):
    """A whole Halt object."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["reversi.dev/v1alpha1"] = Field(default="reversi.dev/v1alpha1", description="API version.")
    kind: Literal["Halt"] = Field(default="Halt", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Object metadata.")
    spec: HaltSpec = Field(description="Why and which calls.")
    status: HaltStatus | None = Field(default=None, description="Observed state.")


class ClusterHalt(ReversiModel):
    """A whole ClusterHalt object."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["reversi.dev/v1alpha1"] = Field(default="reversi.dev/v1alpha1", description="API version.")
    kind: Literal["ClusterHalt"] = Field(default="ClusterHalt", description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Object metadata.")
    spec: ClusterHaltSpec = Field(description="Why and which calls.")
    status: HaltStatus | None = Field(default=None, description="Observed state.")


_HALT_COLUMNS = [
    {"name": "Reason", "type": "string", "jsonPath": ".spec.reason"},
    {"name": "Active", "type": "boolean", "jsonPath": ".status.active"},
    {"name": "Refused", "type": "integer", "jsonPath": ".status.refusedCalls"},
    {"name": "By", "type": "string", "jsonPath": ".spec.by", "priority": 1},
    ready_column(),
    age_column(),
]

HALT_CRD = CrdInfo(
    kind="Halt",
    plural="halts",
    singular="halt",
    short_names=["halt"],
    description="Refuses new calls (recording new steps) of matching runs in this namespace; rollbacks keep working.",
    spec_model=HaltSpec,
    status_model=HaltStatus,
    printer_columns=_HALT_COLUMNS,
)

CLUSTER_HALT_CRD = CrdInfo(
    kind="ClusterHalt",
    plural="clusterhalts",
    singular="clusterhalt",
    short_names=["chalt"],
    scope="Cluster",
    description="Refuses new calls (recording new steps) of matching runs in any namespace; rollbacks keep working.",
    spec_model=ClusterHaltSpec,
    status_model=HaltStatus,
    printer_columns=_HALT_COLUMNS,
)
