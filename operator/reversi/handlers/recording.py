"""The recording webhook's match condition, kept by the operator (docs/concepts.md#recording-with-no-agent-code).

The API server sends the recording webhook (``reversi-admission``'s ``/validate-record``) only the writes
of the users that Runs record, in the namespaces they record them in: its configuration's one match
condition names them (:func:`reversi.adapters.webhooks.recorded_users`). :class:`RecordedUsers` keeps that
condition equal to what the informer of Runs says (:attr:`reversi.engine.retention.RunFacts.recording`):
a Run that starts recording, closes (a rollback took it) or goes is one patch of the configuration, made
by the replica that holds the Lease. It watches the configuration itself too (one object: a field
selector on its name), so a change of anyone else's (an upgrade of the chart, a person, the configuration
deleted and created again) is put right at once, and writes only a difference. Another user's
write never waits on the webhook; a recorded user's write is refused while no admission replica answers
(``failurePolicy: Fail``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kubernetes import client

from ..adapters import apicalls as calls
from ..adapters import webhooks
from ..adapters.informer import Informer, name_key
from ..engine import kube_review
from ..workqueue import Backoff, WorkQueue

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..engine.retention import RunFacts

log = logging.getLogger("reversi.recording")

#: the one key of the queue: every change asks for the same pass
KEY = "recorded-users"


class RecordedUsers:
    """Keeps the recording configuration ``name`` naming the users the Runs of ``runs`` (the operator's
    informer of Runs) record now. ``paused``: the queue starts no pass while true (no Lease held)."""

    def __init__(self, api: client.ApiClient, runs: Informer[Any, RunFacts], name: str, *,
                 paused: Callable[[], bool] = lambda: False, resync_seconds: float = 300.0,
                 timeout: float = calls.TIMEOUT) -> None:
        self.api = api
        self.runs = runs
        self.name = name
        self.resync_seconds = resync_seconds
        self._missing_said = False
        self.queue: WorkQueue[str] = WorkQueue(self._pass, workers=1, backoff=Backoff(1.0, 60.0), paused=paused,
                                               name="recorded-users")
        runs.subscribe(self._changed)
        adm = client.AdmissionregistrationV1Api(api)
        #: the configuration itself, as its match condition stands (a change of anyone's asks for a pass)
        self.configuration: Informer[str, str] = Informer(
            lambda _ns: (adm.list_validating_webhook_configuration, ()), keep=webhooks.condition_of,
            key=name_key, name="recording-webhook", field_selector=f"metadata.name={name}", timeout=timeout)
        self.configuration.subscribe(lambda _key, _old, _new: self.queue.add(KEY))  # a change, or its delete

    def start(self) -> None:
        self.configuration.start()
        self.queue.start()
        self.queue.add(KEY)

    def stop(self) -> None:
        self.configuration.stop()
        self.queue.stop()

    def wanted(self) -> dict[str, tuple[str, ...]]:
        """The users to record now, each with its namespaces (:func:`reversi.engine.kube_review.recorders`)."""
        return kube_review.recorders(facts.recording for facts in self.runs.values())

    def _changed(self, key: Any, old: RunFacts | None, new: RunFacts | None) -> None:
        if (old.recording if old is not None else None) != (new.recording if new is not None else None):
            self.queue.add(KEY)

    def _pass(self, _key: str) -> float | None:
        if not self.runs.synced(0) or not self.configuration.synced(0):
            return 1.0  # the first LIST is not in: naming fewer users now would let their writes through
        wanted = self.wanted()
        now = self.configuration.get(self.name)
        if now is None:
            if not self._missing_said and wanted:
                log.warning("Runs record %d user(s), but there is no ValidatingWebhookConfiguration %s: their writes "
                            "are not recorded (is the chart's webhook.enabled off?)", len(wanted), self.name)
                self._missing_said = True
            return self.resync_seconds
        self._missing_said = False
        if now != webhooks.recorded_users(wanted):
            webhooks.set_recorded(self.api, self.name, wanted)
            log.info("the recording webhook now records %s", ", ".join(f"{user} in {', '.join(spaces)}"
                                                                      for user, spaces in wanted.items()) or "no one")
        return self.resync_seconds
