"""The pure rollback engine (docs/concepts.md#rollback-rules, #the-report): templates, keys, dependency graph, plan,
schedule, verification matching, backoff and report.

Imports only ``reversi.models`` and the standard library: no Kubernetes, no kopf, no I/O.
"""

from .backoff import ceiling_ms, delay_seconds
from .graph import MAX_BLOCKED_BY, DependentIndex, Graph, InvalidRun, build_graph
from .keys import canonical_json, compensation_key, forward_key, snapshot_id
from .plan import (
    BLOCKING_KINDS,
    COMPENSATE,
    DEFER,
    KINDS,
    SKIP,
    UNMANIFESTED,
    UNRECOVERABLE,
    UNRESOLVED,
    build_plan,
    compact_plan,
    effective_outcome,
    undo_by_step,
)
from .report import StepOutcome, build_report, outcomes_from_undo, report_message
from .schedule import (
    AWAITING_APPROVAL,
    COMPENSATED,
    DEFERRED,
    FAILED,
    PENDING,
    RUNNING,
    STATES,
    deferred_steps,
    initial_progress,
    is_finished,
    progress_text,
    ready_steps,
)
from .templates import MissingValue, is_reference, lookup, references, resolve
from .verify import first_mismatch, json_equal, parse_answer

__all__ = [
    "AWAITING_APPROVAL",
    "BLOCKING_KINDS",
    "COMPENSATE",
    "COMPENSATED",
    "DEFER",
    "DEFERRED",
    "DependentIndex",
    "FAILED",
    "Graph",
    "InvalidRun",
    "KINDS",
    "MAX_BLOCKED_BY",
    "MissingValue",
    "PENDING",
    "RUNNING",
    "SKIP",
    "STATES",
    "StepOutcome",
    "UNMANIFESTED",
    "UNRECOVERABLE",
    "UNRESOLVED",
    "build_graph",
    "build_plan",
    "build_report",
    "canonical_json",
    "ceiling_ms",
    "compact_plan",
    "compensation_key",
    "deferred_steps",
    "delay_seconds",
    "effective_outcome",
    "first_mismatch",
    "forward_key",
    "initial_progress",
    "is_finished",
    "is_reference",
    "json_equal",
    "lookup",
    "outcomes_from_undo",
    "parse_answer",
    "progress_text",
    "ready_steps",
    "references",
    "report_message",
    "resolve",
    "snapshot_id",
    "undo_by_step",
]
