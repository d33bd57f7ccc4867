"""Superseded requests (docs/concepts.md#acknowledging-residue): a RollbackRequest that ended ``Incomplete``
stays Stalled while its residue is what stands on its Run, and follows the Run's acknowledgement. Once a later
rollback of the Run says what stands (its own residue, or the earlier one's left as it was), the earlier
request's residue is no longer the one to act on: it becomes Ready, reason ``Superseded``, naming the request
that says what stands. Its phase, report and ``Complete`` condition stay as they ended.

Fed by the operator's informers of Runs and of RollbackRequests (no LIST): a change of a Run's residue request or
lock, or of a request's phase, queues its Run; a pass decides with
:func:`reversi.engine.acknowledgement.superseded` (pure), then reads each request it names and writes its
conditions (a merge patch on the resourceVersion read).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..adapters import status as st
from ..adapters.kube import Conflict, Kube
from ..engine import acknowledgement
from ..models.rollbackrequest import run_ref_name
from ..workqueue import Backoff, WorkQueue

if TYPE_CHECKING:
    from ..adapters.informer import Informer
    from ..engine.retention import RequestFacts, RunFacts

log = logging.getLogger("reversi.superseded")

RunKey = tuple[str, str]


class SupersededRequests:
    """Marks superseded requests Ready (module docstring). ``runs``: the operator's informer of Runs (their
    :class:`~reversi.engine.retention.RunFacts`); ``requests_of(namespace, run)``: the
    :class:`~reversi.engine.retention.RequestFacts` of the requests naming a run (the requests informer's
    index); ``paused``: no pass starts while true (no Lease held)."""

    def __init__(self, kube: Kube, runs: Informer[Any, RunFacts],
                 requests_of: Callable[[str, str], Iterable[RequestFacts]], *,
                 paused: Callable[[], bool] = lambda: False) -> None:
        self.kube = kube
        self.runs = runs
        self.requests_of = requests_of
        self.queue: WorkQueue[RunKey] = WorkQueue(self._pass, workers=1, backoff=Backoff(1.0, 60.0), paused=paused,
                                                  name="superseded")
        runs.subscribe(self._run_changed)

    def start(self) -> None:
        self.queue.start()

    def stop(self) -> None:
        self.queue.stop()

    def request_changed(self, runs: Iterable[RunKey]) -> None:
        """The requests of ``runs`` changed (the requests informer's index says which)."""
        for key in runs:
            self.queue.add(key)

    def _run_changed(self, key: RunKey, old: RunFacts | None, new: RunFacts | None) -> None:
        if new is None:
            return
        if old is None or (old.residue_request, old.active_request) != (new.residue_request, new.active_request):
            self.queue.add(key)

    def _pass(self, key: RunKey) -> float | None:
        facts = self.runs.get(key)
        if facts is None:
            return None
        requests = [(r.name, r.phase, r.ready_reason) for r in self.requests_of(*key)]
        for name in acknowledgement.superseded(facts.residue_request, facts.active_request, requests):
            self._mark(key, name, str(facts.residue_request))
        return None

    def _mark(self, key: RunKey, name: str, holder: str) -> None:
        request = self.kube.get("rollbackrequests", key[0], name)
        if request is None or run_ref_name(request) != key[1]:
            return
        update = st.request_superseded_update(request.get("status"), holder, key[1])
        if update is None:
            return
        try:
            self.kube.merge_status("rollbackrequests", key[0], name, update,
                                   resource_version=request["metadata"]["resourceVersion"])
        except Conflict:
            self.queue.add(key)  # changed since: read it again
            return
        log.info("RollbackRequest %s/%s is superseded: what stands on Run %s is RollbackRequest %s's to say",
                 key[0], name, key[1], holder)
