"""Run Reversi on the local control plane without Helm: CRDs, and the operator as a process.

Used by the demo and the integration tests. The operator process serves its admission webhooks
with a certificate it makes itself and registers them (``REVERSI_WEBHOOK_CONFIGURE``), exactly
as the Helm chart's webhook configurations would, with ``failurePolicy: Fail``.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

CRD_DIR = Path(__file__).resolve().parents[3] / "crds"


def apply_crds(api: client.ApiClient, folder: Path = CRD_DIR, timeout: float = 60) -> list[str]:
    """Create or replace every CRD in ``folder`` and wait until each is Established.

    Returns the CRD names. Raises ``TimeoutError`` naming the CRDs not established in time.
    """
    ext = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted(folder.glob("*.yaml")):
        body = yaml.safe_load(path.read_text())
        names.append(body["metadata"]["name"])
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as err:
            if err.status != 409:
                raise
            current = ext.read_custom_resource_definition(body["metadata"]["name"])
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(body["metadata"]["name"], body)
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending and time.monotonic() < deadline:
        pending = [n for n in pending if not any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(n).status.conditions or [])]
        if pending:
            time.sleep(0.2)
    if pending:
        raise TimeoutError(f"CRDs not established after {timeout:.0f}s: {', '.join(pending)}")
    return names


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def remove_webhook_configurations(api: client.ApiClient, name: str = "reversi.dev") -> None:
    """Delete the webhook configurations a local operator registered (``failurePolicy: Fail``):
    once the operator is gone for good, they would refuse every write of Reversi's kinds."""
    adm = client.AdmissionregistrationV1Api(api)
    for delete in (adm.delete_validating_webhook_configuration, adm.delete_mutating_webhook_configuration):
        try:
            delete(name)
        except ApiException as err:
            if err.status != 404:
                raise


class OperatorProcess:
    """``reversi-operator`` as a child process: :meth:`start`, :meth:`kill` (SIGKILL, like a
    crash), :meth:`stop` (SIGTERM). Its output goes to ``log``."""

    def __init__(self, kubeconfig: Path, log: Path, metrics_port: int = 0, webhook_port: int = 0,
                 tick_seconds: float = 0.5):
        self.kubeconfig = kubeconfig
        self.log = log
        self.metrics_port = metrics_port
        self.webhook_port = webhook_port
        self.tick_seconds = tick_seconds
        self.cert_dir = log.parent / "operator-webhook-certs"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> None:
        """Start the operator; with a webhook port, wait until its webhook server answers TLS.
        Raises ``RuntimeError`` naming the log when it exits or does not come up."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        fh = self.log.open("ab")
        env = {"REVERSI_GAUGE_REFRESH_SECONDS": "2", **os.environ, "PYTHONUNBUFFERED": "1",
               "REVERSI_TICK_SECONDS": str(self.tick_seconds)}
        if self.webhook_port:
            env.update(REVERSI_WEBHOOK_CONFIGURE="true", REVERSI_WEBHOOK_PORT=str(self.webhook_port),
                       REVERSI_WEBHOOK_HOST="127.0.0.1", REVERSI_WEBHOOK_URL_HOST="127.0.0.1",
                       REVERSI_WEBHOOK_CERT_DIR=str(self.cert_dir))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reversi.entrypoints.operator", "--kubeconfig", str(self.kubeconfig),
             "--metrics-port", str(self.metrics_port)],
            stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-5:])
                raise RuntimeError(f"the operator exited at start (code {self.proc.returncode}); "
                                   f"see {self.log}:\n{tail}")
            if self._ready():
                time.sleep(1.0)  # kopf registers the webhook configuration right after serving
                return
            time.sleep(0.2)
        raise RuntimeError(f"the operator did not come up in {timeout:.0f}s; see {self.log}")

    def _ready(self) -> bool:
        if not self.webhook_port:
            return True
        try:
            with socket.create_connection(("127.0.0.1", self.webhook_port), timeout=1) as sock:
                ctx = ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))
                with ctx.wrap_socket(sock, server_hostname="127.0.0.1"):
                    return True
        except (OSError, ssl.SSLError):
            return False

    def kill(self) -> None:
        """SIGKILL the operator: no cleanup runs, as in a crash or an evicted pod."""
        proc = self.proc
        if proc is not None and self.alive():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 seconds."""
        proc = self.proc
        if proc is not None and self.alive():
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return bool(self.proc and self.proc.poll() is None)
