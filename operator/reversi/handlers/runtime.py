"""The operator's shared objects (API client, reconciler, workers, metrics), made at start-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..adapters.kube import Kube
from ..settings import OperatorSettings
from .reconciler import Reconciler
from .workers import Workers


@dataclass
class State:
    settings: OperatorSettings
    kube: Kube
    reconciler: Reconciler
    workers: Workers
    metrics: Any = None
    indices: Any = None  # the live kopf indices (reversi.handlers.indices.Indices), once a handler saw them


_state: State | None = None


def init(settings: OperatorSettings, kube: Kube, metrics: Any = None) -> State:
    """Build the shared objects once; handlers reach them through :func:`state`."""
    global _state
    reconciler = Reconciler(kube, settings, metrics)
    _state = State(settings, kube, reconciler, Workers(reconciler, settings.tick_seconds), metrics)
    return _state


def state() -> State:
    if _state is None:
        raise RuntimeError("the operator's start-up handler has not run yet")
    return _state


def initialised() -> bool:
    """Whether :func:`init` has run (the operator is up; a reconciler used on its own is not)."""
    return _state is not None
