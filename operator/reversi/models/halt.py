r"""Halt (namespaced) and ClusterHalt (cluster): stop *new* calls, never a rollback (rule 9).

``scope`` holds globs (docs/concepts.md#glob-semantics-of-halt-scopes); a call must match every
field named; no scope (or an empty one) halts everything in reach. Lifting a halt is deleting it.

Glob semantics (defined here, once — :func:`glob_match`): a pattern matches the whole value,
case-sensitively; ``*`` matches any run of characters, empty included, **including ``.`` and
``/``** (``payments.*`` matches ``payments.refund`` and ``payments.v2/charge``; ``*`` matches
everything); ``?`` matches exactly one character; ``\`` makes the next character literal
(``\*`` is a star); every other character, ``.``, ``/`` and ``[`` included, stands for itself
(there are no character classes).

A pattern that cannot match anything is refused everywhere (admission, ``kubectl reversi halt
add``) with the reason :func:`pattern_problem` gives, and matches nothing if one is stored anyway:

- an empty pattern (leave the field out to match every value, or write ``*``);
- a lone trailing backslash (it escapes nothing; ``\\`` is a backslash);
- regular-expression syntax: ``^`` at the start, an unescaped ``$`` at the end, or an unescaped
  ``(``, ``)``, ``[``, ``]``, ``{``, ``}``, ``|`` or ``+`` (escape it with ``\`` to mean the
  character itself, where the field allows it);
- a space at either end;
- in ``tool`` and ``namespace``: a character no tool name (letters, digits, ``.``, ``_``,
  ``:``, ``/``, ``-``, starting with a letter or digit) or namespace name (lowercase letters,
  digits, ``-``, starting and ending with a letter or digit) can hold there.
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
    if escaped:  # a lone trailing backslash: refused (pattern_problem); it stands for itself here
        tokens.append("\\")
    return tuple(tokens)


#: characters a value of each field can hold (None: any); see :func:`pattern_problem`
ALPHABETS: dict[str, tuple[str, str]] = {
    "tool": ("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:/-",
             "a tool name holds only letters, digits and . _ : / - and starts with a letter or digit"),
    "namespace": ("abcdefghijklmnopqrstuvwxyz0123456789-",
                  "a namespace name holds only lowercase letters, digits and - and starts with a letter or digit"),
}
_REGEX_ONLY = "()[]{}|+"
_ALNUM = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def pattern_problem(field: str, pattern: str) -> str | None:
    """Why the halt glob ``pattern`` for scope ``field`` can never match what it seems to mean,
    or None when it is a valid pattern. One rule for every entry point: the webhooks refuse such
    a pattern, ``kubectl reversi halt add`` refuses it before sending, matching treats it as
    matching nothing, and ``halt list`` shows it (module docstring)."""
    if pattern == "":
        return ("an empty pattern matches nothing; leave the field out to match every value, "
                "or write * for any value")
    trailing = len(pattern) - len(pattern.rstrip("\\"))
    if trailing % 2 == 1:
        return "a trailing backslash escapes nothing; write \\\\ for a backslash, or drop it"
    if pattern != pattern.strip():
        return "it starts or ends with a space, so it cannot match a value as written; remove the space"
    literal, escaped = [], False
    for ch in pattern:
        if escaped:
            literal.append((ch, True))
            escaped = False
        elif ch == "\\":
            escaped = True
        else:
            literal.append((ch, False))
    unescaped = [ch for ch, esc in literal if not esc]
    if pattern.startswith("^") or (literal and literal[-1] == ("$", False)) or any(
            ch in _REGEX_ONLY for ch in unescaped):
        return ("it looks like a regular expression, but halt patterns are globs that always match the whole "
                "value: * is any run of characters, ? one character (payments.* matches every payments "
                "tool); escape a character with \\ to mean it literally")
    if field in ALPHABETS:
        chars, rule = ALPHABETS[field]
        for ch, esc in literal:
            if (esc or ch not in "*?") and ch not in chars:
                return f"{ch!r} can never match: {rule}"
        first, last = literal[0], literal[-1]
        if (first[1] or first[0] not in "*?") and first[0] not in _ALNUM:
            return f"it starts with {first[0]!r}, which can never match: {rule}"
        if field == "namespace" and (last[1] or last[0] not in "*?") and last[0] not in _ALNUM:
            return f"it ends with {last[0]!r}, which can never match: a namespace name ends with a letter or digit"
    return None


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

    tool: Glob | None = Field(default=None, max_length=MAX_NAME,
                              description='Glob over the tool name, e.g. "payments.*".')
    actor: Glob | None = Field(default=None, max_length=MAX_NAME, description="Glob over the run's scope.actor.")
    tenant: Glob | None = Field(default=None, max_length=MAX_NAME, description="Glob over the run's scope.tenant.")
    environment: Glob | None = Field(
        default=None, max_length=MAX_NAME, description="Glob over the run's scope.environment."
    )

    def matches(self, **call: str | None) -> bool:
        """Whether a call matches every field named in this scope.

        ``call`` holds ``tool``, ``actor``, ``tenant``, ``environment`` (and ``namespace`` for a
        ClusterHalt); a named field with no value in the call does not match, and neither does a
        pattern that :func:`pattern_problem` refuses (it was stored before the rule, or around it).
        """
        for field, pattern in self.model_dump(exclude_none=True).items():
            value = call.get(field)
            if value is None or pattern_problem(field, pattern) or not glob_match(pattern, value):
                return False
        return True

    def problems(self) -> list[tuple[str, str, str]]:
        """``(field, pattern, why)`` for every pattern that can never match (:func:`pattern_problem`)."""
        out = []
        for field, pattern in self.model_dump(exclude_none=True).items():
            why = pattern_problem(field, pattern)
            if why:
                out.append((field, pattern, why))
        return out


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

    scope: ClusterHaltScope | None = Field(default=None,
                                           description="Which calls; none halts every call in the cluster.")


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
