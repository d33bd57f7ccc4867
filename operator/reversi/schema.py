"""Do the installed CRDs match this operator? The schema-version check, as pure functions.

Every generated CRD carries ``metadata.annotations["reversi.dev/schema-version"]`` (an integer,
:data:`reversi.models.common.SCHEMA_VERSION` of the models it was generated from). An operator
that writes status fields a stale CRD does not know would see them pruned without a word, so it
compares the installed CRDs with its own version at start-up and on every CRD change, and
refuses to reconcile while any of its CRDs is missing or older (``reversi.handlers.schema``).

A newer CRD than the operator is accepted: CRD changes only add optional fields, and the
operator ignores what it does not know. This module imports only the models.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterable

from .models import ALL_CRDS
from .models.common import SCHEMA_VERSION, SCHEMA_VERSION_ANNOTATION

CRD_NAMES: tuple[str, ...] = tuple(info.crd_name for info in ALL_CRDS)


@dataclass(frozen=True)
class SchemaCheck:
    """The verdict: ``installed`` maps each of Reversi's CRD names to its schema version (0: no
    annotation, i.e. older than the annotation; ``None``: not installed); ``wanted`` is the
    operator's version; ``problems`` say, one per CRD, what is missing, empty when all is well."""

    installed: dict[str, int | None]
    wanted: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def oldest(self) -> int | None:
        """The lowest installed version (``None`` when a CRD is missing)."""
        versions = list(self.installed.values())
        return None if not versions or any(v is None for v in versions) else min(v for v in versions if v is not None)

    def summary(self) -> str:
        """One line for logs, Events and ``kubectl reversi version``."""
        if self.ok:
            return f"the installed CRDs are at schema version {self.oldest} (the operator needs {self.wanted})"
        return ("; ".join(self.problems) + f". Upgrade the CRDs (helm upgrade, or kubectl apply -f crds/) to "
                f"schema version {self.wanted}; until then the operator reconciles nothing, because the API "
                "server would prune the status fields it writes")


def version_of(crd: dict) -> int:
    """The schema version a CRD (dict) carries; 0 when it has no (or no valid) annotation."""
    value = ((crd.get("metadata") or {}).get("annotations") or {}).get(SCHEMA_VERSION_ANNOTATION)
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


def check(crds: Iterable[dict], wanted: int = SCHEMA_VERSION) -> SchemaCheck:
    """Compare the installed CRDs (dicts; any CRDs, those not Reversi's are ignored) with
    ``wanted``. A missing CRD or one whose version is below ``wanted`` is a problem, named
    with both versions, e.g. ``runs.reversi.dev has schema version 1, the operator needs 2``."""
    by_name = {(crd.get("metadata") or {}).get("name"): crd for crd in crds}
    installed: dict[str, int | None] = {}
    problems: list[str] = []
    for name in CRD_NAMES:
        crd = by_name.get(name)
        if crd is None:
            installed[name] = None
            problems.append(f"{name} is not installed (the operator needs schema version {wanted})")
            continue
        have = installed[name] = version_of(crd)
        if have < wanted:
            shown = "no schema version (older than 2)" if have == 0 else f"schema version {have}"
            problems.append(f"{name} has {shown}, the operator needs {wanted}")
    return SchemaCheck(installed, wanted, tuple(problems))
