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
from pathlib import Path
from typing import Any

import click
import kopf

from ..adapters import webhooks
from ..adapters.kube import Kube
from ..handlers import admission as _admission  # noqa: F401 - registers the webhooks and the manifest index
from ..handlers import runtime
from ..metrics import AdmissionMetrics
from ..settings import OperatorSettings
from . import common

log = logging.getLogger("reversi.admission")
_settings: OperatorSettings | None = None


class _RefusalsAreNotErrors(logging.Filter):
    """kopf logs every admission refusal as a failed handler at ERROR; a refusal is the webhook
    doing its job (the webhook logs it at INFO itself), so those records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Webhook '") and "failed permanently" in message)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """kopf settings, the webhook server, and the objects the webhooks read (API client, metrics)."""
    ours = _settings or OperatorSettings()
    common.configure_kopf(settings, ours)
    settings.execution.max_workers = ours.admission_threads
    settings.peering.standalone = True  # replicas work side by side: admission has nothing to hand over
    served, made_ca = common.configure_webhooks(settings, ours)
    if not served:
        raise kopf.PermanentError("reversi-admission serves nothing without a certificate: set REVERSI_WEBHOOK_CERT "
                                  "and REVERSI_WEBHOOK_KEY (the chart does) or REVERSI_WEBHOOK_CONFIGURE=true")
    # a connection for each read a review makes at once, and one for the handler thread itself
    connections = (runtime.READS_PER_REVIEW + 1) * ours.admission_threads
    kube = Kube(common.api_client(os.environ.get("REVERSI_KUBECONFIG"), connections), timeout=ours.api_timeout_seconds)
    if ours.webhook_configure and made_ca:
        # the local control plane: register the webhooks and the API server's policy here, as the
        # chart's templates would (a write arriving before the server listens is refused as
        # "failed calling webhook", which the SDK tries again)
        url = f"https://{ours.webhook_url_host}:{ours.webhook_port}"
        webhooks.register(kube.api, webhooks.url_client_config(url, Path(made_ca).read_bytes()))
    metrics = AdmissionMetrics()
    if ours.metrics_port:
        metrics.serve(ours.metrics_port)
    runtime.init_admission(ours, kube, metrics)


kopf.on.login()(common.login)


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--namespace", "namespaces", multiple=True, help="Namespace to serve (repeatable); default: all.")
@click.option("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster or $KUBECONFIG).")
@click.option("--metrics-port", type=int, default=None, help="Prometheus /metrics port (0: off).")
@click.option("--verbose", is_flag=True, help="Debug logging.")
def main(namespaces: tuple[str, ...], kubeconfig: str | None, metrics_port: int | None, verbose: bool) -> None:
    global _settings
    _settings = common.settings_from_flags(namespaces, kubeconfig, metrics_port, verbose)
    objects = logging.getLogger("kopf.objects")
    objects.addFilter(_RefusalsAreNotErrors())
    if not verbose:  # kopf says "Webhook ... succeeded" for every review: one line per recorded call
        objects.setLevel(logging.WARNING)
    kopf.run(clusterwide=not _settings.namespaces, namespaces=_settings.namespaces, standalone=True,
             liveness_endpoint=common.liveness_endpoint(_settings),
             identity=common.identity())


if __name__ == "__main__":
    main()
