"""``reversi-operator``: run the Reversi operator (kopf).

    reversi-operator [--namespace NS ...] [--metrics-port 8080] [--kubeconfig PATH]

Settings come from ``REVERSI_*`` environment variables (:class:`reversi.settings.OperatorSettings`);
flags override them. In a pod the in-cluster service account is used, elsewhere ``--kubeconfig`` or
``$KUBECONFIG``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp.web
import click
import kopf
from kubernetes import client, config

from ..adapters.kube import Kube
from .. import certs
from ..handlers import halts as _halt_handlers  # noqa: F401 - registers the handlers
from ..handlers import indices as _indices  # noqa: F401 - registers the kopf indices
from ..handlers import manifests as _manifest_handlers  # noqa: F401
from ..handlers import peering as _peering  # noqa: F401 - workers follow kopf's peering pause
from ..handlers import rollback as _rollback_handlers  # noqa: F401
from ..handlers import runs as _run_handlers  # noqa: F401
from ..handlers import runtime
from ..handlers import schema as schema_handlers
from ..metrics import Metrics
from ..settings import OperatorSettings

log = logging.getLogger("reversi.operator")
_settings: OperatorSettings | None = None
_stop = threading.Event()
PEERING_PRIORITY_BASE = 10**11
M_ARENA_MAX = -8  # glibc's malloc.h
WEBHOOK_MAX_BODY = 32 * 1024 * 1024  # bytes; the API server itself refuses requests over 3 MiB


def limit_malloc_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas (``mallopt(M_ARENA_MAX, arenas)``) before threads start: glibc
    otherwise gives threads up to 8 arenas per core, and the memory each one frees stays resident
    in it (P5 of benchmarks/rollback_bench.py: about 10 MB with 2,000 Runs). Returns whether the
    cap was applied: not with ``arenas`` 0, not when ``MALLOC_ARENA_MAX`` is set (glibc read it
    already) and not on a C library without ``mallopt`` (musl, macOS). Raises nothing."""
    if arenas <= 0 or os.environ.get("MALLOC_ARENA_MAX") or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return bool(mallopt is not None and mallopt(M_ARENA_MAX, arenas) == 1)


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """An API client: in-cluster when in a pod, else from ``kubeconfig`` / ``$KUBECONFIG``."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(
            "/var/run/secrets/kubernetes.io/serviceaccount/token"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=kubeconfig)


class _RefusalsAreNotErrors(logging.Filter):
    """kopf logs every admission refusal as a failed handler at ERROR; a refusal is the webhook
    doing its job (the webhook logs it at INFO itself), so those records are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Webhook '") and "failed permanently" in message)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """kopf settings (progress in annotations, never in status) and the shared objects."""
    ours = _settings or OperatorSettings()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="reversi.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="reversi.dev")
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = ours.handler_threads
    settings.watching.server_timeout = 300  # the API server ends each watch after this many seconds
    settings.watching.client_timeout = 330  # and the client gives up on a silent one a little later
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = ours.api_timeout_seconds
    settings.networking.connect_timeout = 10
    if ours.peering is None:
        settings.peering.standalone = True
    else:
        # kopf freezes every operator of the same priority, so replicas must differ: the oldest
        # replica gets the highest priority and works; younger ones stand by (a restarted pod
        # never preempts the one at work) and take over when it is gone
        settings.peering.name = ours.peering
        settings.peering.mandatory = True
        settings.peering.priority = PEERING_PRIORITY_BASE - int(time.time() * 10) % PEERING_PRIORITY_BASE
    _configure_webhooks(settings, ours)
    kube = Kube(api_client(os.environ.get("REVERSI_KUBECONFIG")), timeout=ours.api_timeout_seconds)
    metrics = Metrics(namespaces=ours.namespaces)
    if ours.metrics_port:
        metrics.serve(ours.metrics_port)
    threading.Thread(target=metrics.refresh_forever, args=(kube, ours.gauge_refresh_seconds, _stop), daemon=True,
                     name="metrics-refresh").start()
    state = runtime.init(ours, kube, metrics)
    # before any handler writes: refuse to reconcile against CRDs older than this operator
    schema_handlers.check_now(state)


def _configure_webhooks(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    """Serve the admission webhooks over TLS with a certificate made by ``cryptography``.

    With ``webhook_cert``/``webhook_key`` (the chart mounts them), the server uses those files
    and the chart owns the webhook configurations. With ``webhook_configure`` (local control
    plane), the operator makes a CA and serving certificate itself and lets kopf create the
    configurations, pointing at ``https://<webhook_url_host>:<webhook_port>``. Neither: no
    webhooks are served (writes are not checked beyond the CRD's CEL rules).
    """
    certfile, keyfile, cafile = ours.webhook_cert, ours.webhook_key, None
    if not certfile and ours.webhook_configure:
        folder = Path(ours.webhook_cert_dir or tempfile.mkdtemp(prefix="reversi-webhook-"))
        ca = certs.make_ca(folder, name="reversi-webhook-ca")
        host = ours.webhook_url_host
        ip = [host] if host.replace(".", "").isdigit() else []
        pair = certs.issue(ca, folder, "webhook", "reversi-webhook", dns_names=("localhost", *([] if ip else [host])),
                           ip_addresses=tuple(ip or ["127.0.0.1"]), server=True)
        certfile, keyfile, cafile = str(pair.cert), str(pair.key), str(ca.cert)
    if not certfile:
        log.warning("admission webhooks are not served: set REVERSI_WEBHOOK_CERT/KEY (the chart does) "
                    "or REVERSI_WEBHOOK_CONFIGURE=true")
        return
    # The API server sends a whole object (twice, on update) in each review: a Run of thousands of
    # steps is megabytes. aiohttp's default body limit (1 MiB) would refuse it with 413, and kopf
    # builds its aiohttp application itself, so the operator raises the default for its process.
    defaults = aiohttp.web.Application.__init__.__kwdefaults__
    assert defaults is not None, "aiohttp.web.Application takes client_max_size as a keyword argument"
    defaults["client_max_size"] = WEBHOOK_MAX_BODY
    settings.admission.server = kopf.WebhookServer(
        addr=ours.webhook_host, port=ours.webhook_port, host=ours.webhook_url_host if ours.webhook_configure else None,
        certfile=certfile, pkeyfile=keyfile, cafile=cafile)
    if ours.webhook_configure:
        settings.admission.managed = "reversi.dev"


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own connection: from ``--kubeconfig`` when given, else in-cluster or ``$KUBECONFIG``
    through the official client (kopf's default)."""
    path = os.environ.get("REVERSI_KUBECONFIG")
    if not path:
        return kopf.login_via_client(**kwargs)
    cfg = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=cfg)
    token = (cfg.api_key or {}).get("authorization", "")
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file, private_key_path=cfg.key_file,
        scheme="Bearer" if token else None, token=token.removeprefix("Bearer ") or None)


@kopf.on.probe(id="rollbacks")
def rollbacks_probe(**_: Any) -> int:
    """Liveness detail: how many RollbackRequests are queued or in a pass (kopf answers /healthz
    only while its watches and handlers run; this adds what the operator is doing)."""
    return runtime.state().workers.count() if runtime.initialised() else 0


@kopf.on.cleanup()
def cleanup(**_: Any) -> None:
    _stop.set()
    try:
        state = runtime.state()
        state.workers.stop_all()
        if state.journals is not None:
            state.journals.stop_all()
    except RuntimeError:
        pass


@click.command(help=__doc__.split("\n\n")[0])
@click.option("--namespace", "namespaces", multiple=True, help="Namespace to watch (repeatable); default: all.")
@click.option("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster or $KUBECONFIG).")
@click.option("--metrics-port", type=int, default=None, help="Prometheus /metrics port (0: off).")
@click.option("--verbose", is_flag=True, help="Debug logging.")
def main(namespaces: tuple[str, ...], kubeconfig: str | None, metrics_port: int | None, verbose: bool) -> None:
    global _settings
    overrides: dict[str, Any] = {}
    if namespaces:
        overrides["namespaces"] = list(namespaces)
    if metrics_port is not None:
        overrides["metrics_port"] = metrics_port
    _settings = OperatorSettings(**overrides)
    limit_malloc_arenas(_settings.malloc_arenas)
    if kubeconfig:
        os.environ["REVERSI_KUBECONFIG"] = kubeconfig
        os.environ["KUBECONFIG"] = kubeconfig
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("kubernetes.client.rest", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").addFilter(_RefusalsAreNotErrors())
    if _settings.webhook_cert or _settings.webhook_configure:
        # kopf refuses admission handlers without a webhook server: register them only when served
        from ..handlers import admission  # noqa: F401
    liveness = f"http://0.0.0.0:{_settings.health_port}/healthz" if _settings.health_port else None
    kopf.run(clusterwide=not _settings.namespaces, namespaces=_settings.namespaces,
             standalone=_settings.peering is None, liveness_endpoint=liveness)


if __name__ == "__main__":
    main()
