"""What the two kopf processes share: ``reversi-operator`` (reconciling) and ``reversi-admission``
(the admission webhooks). Nothing here registers a kopf handler: each entry point registers its own,
so importing this module adds none of the other process's handlers."""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kopf
from kubernetes import client, config

from .. import certs
from ..adapters.apicalls import api_client as api_client  # the entry points call it as common.api_client
from ..settings import OperatorSettings
from .webhookserver import WEBHOOK_MAX_BODY, Deadlines, WebhookServer

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("reversi.process")
M_ARENA_MAX = -8  # glibc's malloc.h


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


def configure_kopf(settings: kopf.OperatorSettings, ours: OperatorSettings) -> None:
    """kopf settings both processes use: progress in annotations (never in status), handler
    threads, watch and request timeouts."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="reversi.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="reversi.dev")
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = ours.handler_threads
    settings.watching.server_timeout = 300  # the API server ends each watch after this many seconds
    settings.watching.client_timeout = 330  # and the client gives up on a silent one a little later
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = ours.api_timeout_seconds
    settings.networking.connect_timeout = 10


def configure_webhooks(settings: kopf.OperatorSettings, ours: OperatorSettings,
                       on_drop: Callable[[str], None] | None = None) -> tuple[bool, str | None]:
    """Serve the admission webhooks over TLS (:class:`reversi.entrypoints.webhookserver.WebhookServer`,
    review bodies up to :data:`WEBHOOK_MAX_BODY` bytes) with the given certificate or one made by
    ``cryptography``.

    With ``webhook_cert``/``webhook_key`` (the chart mounts them), the server uses those files
    and the chart owns the webhook configurations. With ``webhook_configure`` (local control
    plane), the process makes a CA and serving certificate itself; the caller registers the
    configurations (:func:`reversi.adapters.webhooks.register`), pointing at
    ``https://<webhook_url_host>:<webhook_port>``. Returns (served, the CA file of a certificate
    made here); neither setting (or a certificate without its key): ``(False, None)``, nothing is served.
    A connection that stalls is dropped after ``webhook_headers_seconds``, ``webhook_idle_seconds`` or
    ``webhook_body_seconds`` (by stage), and ``on_drop`` is called with the stage's name.
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
    if not certfile or not keyfile:
        return False, None
    # a review carries a whole object (twice, on update): megabytes for a Run of thousands of steps,
    # past the 1 MiB that kopf's own server takes (see reversi.entrypoints.webhookserver)
    deadlines = Deadlines(headers=ours.webhook_headers_seconds, idle=ours.webhook_idle_seconds,
                          body=ours.webhook_body_seconds)
    settings.admission.server = WebhookServer(addr=ours.webhook_host, port=ours.webhook_port, certfile=certfile,
                                              keyfile=keyfile, cafile=cafile, max_body=WEBHOOK_MAX_BODY,
                                              deadlines=deadlines, on_drop=on_drop)
    return True, cafile


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own connection: from ``--kubeconfig`` when given, else in-cluster or ``$KUBECONFIG``
    through the official client (kopf's default). Each entry point registers it with
    ``kopf.on.login``."""
    path = os.environ.get("REVERSI_KUBECONFIG")
    if not path:
        return kopf.login_via_client(**kwargs)
    cfg = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=cfg)
    # a kubeconfig's token (a ServiceAccount's, say): the official client keeps it under "BearerToken"
    # (older releases: "authorization"), as "Bearer <token>"
    keys = cfg.api_key or {}
    token = keys.get("BearerToken") or keys.get("authorization") or ""
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file, private_key_path=cfg.key_file,
        scheme="Bearer" if token else None, token=token.removeprefix("Bearer ") or None)


def setup_logging(verbose: bool) -> None:
    """Log lines with time, level and logger; the client's and aiohttp's chatter at WARNING."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("kubernetes.client.rest", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def settings_from_flags(namespaces: tuple[str, ...], kubeconfig: str | None, metrics_port: int | None,
                        verbose: bool) -> OperatorSettings:
    """The process's settings: ``REVERSI_*`` variables, overridden by the command's flags; also
    caps malloc arenas, points the clients at ``kubeconfig`` and sets up logging. Raises
    pydantic's ``ValidationError`` naming a setting that is out of range."""
    overrides: dict[str, Any] = {}
    if namespaces:
        overrides["namespaces"] = list(namespaces)
    if metrics_port is not None:
        overrides["metrics_port"] = metrics_port
    ours = OperatorSettings(**overrides)
    limit_malloc_arenas(ours.malloc_arenas)
    if kubeconfig:
        os.environ["REVERSI_KUBECONFIG"] = kubeconfig
        os.environ["KUBECONFIG"] = kubeconfig
    setup_logging(verbose)
    return ours


def identity() -> Any:
    """This process's name for kopf (its ``identity``), a str (typed
    ``Any``: kopf's own type for it, a NewType of str, is not public): its host name
    (a pod's name) and a unique suffix, ``<host>/<UTC time>-<random hex>``. kopf's own default
    starts with the user's name from the password database, which a container that runs as a bare
    user id (the image's 65532 under a restricted Pod Security Standard) may not have: kopf then
    fails at start-up."""
    import datetime as dt
    import secrets

    now = dt.datetime.now(dt.UTC).strftime("%Y%m%d%H%M%S")
    return f"{platform.node() or 'reversi'}/{now}-{secrets.token_hex(3)}"


def liveness_endpoint(ours: OperatorSettings) -> str | None:
    """kopf's liveness endpoint URL, or None when ``health_port`` is 0."""
    return f"http://0.0.0.0:{ours.health_port}/healthz" if ours.health_port else None
