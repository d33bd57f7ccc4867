"""``reversi-admission``: serve Reversi's admission webhooks, apart from the reconciling operator.

    reversi-admission [--namespace NS ...] [--metrics-port 8080] [--kubeconfig PATH]

Every call an agent records passes these webhooks, so they run as a process of their own
(the chart's ``admission`` Deployment: at least two replicas, a PodDisruptionBudget, rolling
updates that keep a ready replica): a stopped, restarted or busy operator stops no agent, and
recording never waits on reconciling. Replicas share nothing but the API server; each answers
from its own watch of ToolManifests (a kopf index) and never writes but the refusal counts of
Halts. The rules each webhook enforces, and those the API server enforces itself, are in
docs/operations.md#admission-where-each-rule-is-enforced.

Settings are :class:`reversi.settings.OperatorSettings` (``REVERSI_WEBHOOK_*``, ``REVERSI_API_TIMEOUT_SECONDS``,
``REVERSI_ADMISSION_THREADS``, ``REVERSI_HEALTH_PORT``); flags override them. Replicas on one host
may share the webhook port (it is bound with ``SO_REUSEPORT``: the kernel spreads connections).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import click
import kopf

from ..adapters import apicalls as calls
from ..adapters import webhooks
from ..adapters.kube import Kube
from ..engine import kube_review
from ..handlers import admission as _admission  # noqa: F401 - registers the webhooks and the manifest index
from ..handlers import runtime
from .. import recorder
from ..metrics import AdmissionMetrics
from . import common
from .webhookserver import WebhookServer

log = logging.getLogger("reversi.admission")


class RefusalsAreNotErrors(logging.Filter):
    """A filter for kopf's ``kopf.objects`` logger (kopf documents filtering its logs with
    ``logging.Filter``: docs.kopf.dev, "Configuration", "Log levels & filters") that drops kopf's
    ERROR record of an admission refusal: a refusal is the webhook doing its job (it logs the
    refusal at INFO itself, :mod:`reversi.handlers.admission`), not an error.

    kopf offers nothing more direct: a webhook refuses only by raising ``kopf.AdmissionError``, kopf
    logs every such handler at ERROR as having failed, the record carries no exception, and neither
    its wording nor its extra fields are an interface of kopf's. kopf writes that record while it
    handles the refusal, so the filter judges by the exception being handled then (the record's own
    ``exc_info``, else ``sys.exc_info()``) and by its type alone, ``kopf.AdmissionError`` (public),
    never by the text. A handler that crashes is still logged at ERROR with its traceback: by kopf
    (the exception is not an AdmissionError) or, for the webhooks wrapped by
    :func:`reversi.handlers.admission.untrusted`, by that wrapper before it refuses with 500."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        handled = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        return not isinstance(handled, kopf.AdmissionError)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """kopf settings, the webhook server, and the objects the webhooks read (API client, metrics)."""
    ours = runtime.settings_of(memo)
    common.configure_kopf(settings, ours)
    settings.execution.max_workers = ours.admission_threads
    settings.peering.standalone = True  # replicas work side by side: admission has nothing to hand over
    metrics = AdmissionMetrics()
    served, made_ca = common.configure_webhooks(settings, ours, on_drop=metrics.dropped_connection)
    if not served:
        raise kopf.PermanentError("reversi-admission serves nothing without a certificate: set REVERSI_WEBHOOK_CERT "
                                  "and REVERSI_WEBHOOK_KEY (the chart does) or REVERSI_WEBHOOK_CONFIGURE=true")
    # a connection for each read a review makes at once, and one for the handler thread itself
    connections = (runtime.READS_PER_REVIEW + 1) * ours.admission_threads
    kube = Kube(common.api_client(os.environ.get("REVERSI_KUBECONFIG"), connections), timeout=ours.api_timeout_seconds)
    # the recording webhook (docs/concepts.md#recording-with-no-agent-code): served by the project's own code
    runs = recorder.runs_informer(kube.api, list(ours.namespaces or []), ours.api_timeout_seconds)
    runs.start()
    if ours.webhook_configure and made_ca:
        # the local control plane: register the webhooks and the API server's policy here, as the
        # chart's templates would (a write arriving before the server listens is refused as
        # "failed calling webhook", which the SDK tries again); a recording configuration made
        # again names the users open Runs record, never no one
        url = f"https://{ours.webhook_url_host}:{ours.webhook_port}"
        runs.synced(ours.api_timeout_seconds)
        webhooks.register(kube.api, webhooks.url_client_config(url, Path(made_ca).read_bytes()),
                          recorder=calls.whoami(kube.api),
                          recorders=kube_review.recorders((run.user, run.namespaces) for run in runs.values()))
    writes = recorder.WriteRecorder(kube.api, runs)
    assert isinstance(settings.admission.server, WebhookServer)
    settings.admission.server.routes[webhooks.RECORD_HOOK.path.lstrip("/")] = writes.review
    memo[RECORDING_KEY] = (runs, writes)
    if ours.metrics_port:
        metrics.serve(ours.metrics_port)
    memo[runtime.MEMO_KEY] = runtime.build_admission(ours, kube, metrics)  # every webhook's memo.parts
    # kopf resolves the kinds it watches (the ToolManifests' index) once, after this activity
    while missing := calls.wait_until_served(kube.custom, 30, WATCHED):
        log.warning("the API server does not serve %s yet; kopf resolves the kinds it watches once, at its start: "
                    "waiting (are Reversi's CRDs installed?)", ", ".join(missing))


#: the memo key of the recording webhook's informer and recorder (stopped at cleanup)
RECORDING_KEY = "reversi_recording"


@kopf.on.cleanup()
def stop_recording(memo: kopf.Memo, **_: Any) -> None:
    """Stop the recording webhook's informer and its settling threads."""
    held = memo.get(RECORDING_KEY)
    if held is not None:
        runs, writes = held
        runs.stop()
        writes.close()


#: what the admission server watches (kopf's index of ToolManifests), for :func:`calls.wait_until_served`
WATCHED = (("apiextensions.k8s.io", "v1", "customresourcedefinitions"), (calls.GROUP, calls.VERSION, "toolmanifests"))


kopf.on.login()(common.login)


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--namespace", "namespaces", multiple=True, help="Namespace to serve (repeatable); default: all.")
@click.option("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster or $KUBECONFIG).")
@click.option("--metrics-port", type=int, default=None, help="Prometheus /metrics port (0: off).")
@click.option("--verbose", is_flag=True, help="Debug logging.")
def main(namespaces: tuple[str, ...], kubeconfig: str | None, metrics_port: int | None, verbose: bool) -> None:
    ours = common.settings_from_flags(namespaces, kubeconfig, metrics_port, verbose)
    objects = logging.getLogger("kopf.objects")
    objects.addFilter(RefusalsAreNotErrors())
    if not verbose:  # kopf says "Webhook ... succeeded" for every review: one line per recorded call
        objects.setLevel(logging.WARNING)
    kopf.run(clusterwide=not ours.namespaces, namespaces=ours.namespaces, standalone=True,
             liveness_endpoint=common.liveness_endpoint(ours),
             identity=common.identity(), memo=kopf.Memo({runtime.SETTINGS_KEY: ours}))


if __name__ == "__main__":
    main()
