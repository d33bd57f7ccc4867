"""Run Reversi on the local control plane without Helm: CRDs, the operator and the admission
server as processes.

Used by the demo, the benchmarks and the integration tests. The admission server
(``reversi-admission``) serves the webhooks with a certificate it makes itself and registers them
(``REVERSI_WEBHOOK_CONFIGURE``), exactly as the Helm chart's webhook configurations would, with
``failurePolicy: Fail``; the operator (``reversi-operator``) reconciles, in a process of its own.
"""

from __future__ import annotations

import os
import random
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

from reversi.adapters import webhooks

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


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


#: where :func:`free_port` picks: above the control plane's and the tests' fixed ports (16443, 2379-2380,
#: 18089+, 19089+, 20250) and below Linux's default ephemeral range (32768-60999)
PICKED_PORTS = range(21000, 32000)


def free_port(attempts: int = 200) -> int:
    """A TCP port on 127.0.0.1 that is free right now, picked at random from :data:`PICKED_PORTS`.

    Never from the kernel's ephemeral range (``net.ipv4.ip_local_port_range``): a port picked there can be
    taken by any process's outgoing connection before the server it is meant for binds it (``Address already
    in use``), which happened under a parallel suite. Raises ``RuntimeError`` after ``attempts`` busy ports.
    """
    low, high = _ephemeral_range()
    for _ in range(attempts):
        port = random.choice(PICKED_PORTS)
        if low <= port <= high:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PICKED_PORTS.start}-{PICKED_PORTS.stop - 1} after {attempts} tries")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def remove_webhook_configurations(api: client.ApiClient, name: str = "reversi.dev") -> None:
    """Delete the webhook configurations a local admission server registered (``failurePolicy:
    Fail``: once it is gone for good, they would refuse every write of Reversi's kinds); the
    admission policies, which the API server runs itself, stay (:func:`reversi.adapters.webhooks.unregister`)."""
    webhooks.unregister(api, name)


class _Process:
    """A Reversi process as a child: :meth:`kill` (SIGKILL, like a crash), :meth:`stop` (SIGTERM).
    Its output goes to ``log``."""

    proc: subprocess.Popen | None = None
    log: Path

    def _spawn(self, module: str, args: list[str], env: dict[str, str], what: str, timeout: float) -> None:
        """Start ``python -m module args``; wait until :meth:`_ready`. Raises ``RuntimeError``
        naming the log when it exits or does not come up in ``timeout`` seconds."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        fh = self.log.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=fh, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-5:])
                raise RuntimeError(f"the {what} exited at start (code {self.proc.returncode}); see {self.log}:\n{tail}")
            if self._ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the {what} did not come up in {timeout:.0f}s; see {self.log}")

    def _ready(self) -> bool:
        return True

    def kill(self) -> None:
        """SIGKILL the process: no cleanup runs, as in a crash or an evicted pod."""
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


class AdmissionProcess(_Process):
    """``reversi-admission`` as a child process, serving the admission webhooks on ``webhook_port``
    with a certificate it makes itself and registering them (``REVERSI_WEBHOOK_CONFIGURE``),
    exactly as the Helm chart's webhook configurations would, with ``failurePolicy: Fail``.
    :meth:`start` returns once the API server calls it (kopf registers the configurations right
    after its server answers)."""

    def __init__(self, kubeconfig: Path, log: Path, webhook_port: int, health_port: int = 0, metrics_port: int = 0):
        self.kubeconfig = kubeconfig
        self.log = log
        self.webhook_port = webhook_port
        self.health_port = health_port
        self.metrics_port = metrics_port
        self.cert_dir = log.parent / f"{log.stem}-webhook-certs"

    def start(self, timeout: float = 30) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "REVERSI_WEBHOOK_CONFIGURE": "true",
               "REVERSI_WEBHOOK_PORT": str(self.webhook_port), "REVERSI_WEBHOOK_HOST": "127.0.0.1",
               "REVERSI_WEBHOOK_URL_HOST": "127.0.0.1", "REVERSI_WEBHOOK_CERT_DIR": str(self.cert_dir),
               "REVERSI_HEALTH_PORT": str(self.health_port)}
        self._spawn("reversi.entrypoints.admission",
                    ["--kubeconfig", str(self.kubeconfig), "--metrics-port", str(self.metrics_port)],
                    env, "admission server", timeout)
        self._wait_registered(timeout)

    def _ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.webhook_port), timeout=1) as sock:
                ctx = ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))
                with ctx.wrap_socket(sock, server_hostname="127.0.0.1"):
                    return True
        except (OSError, ssl.SSLError):
            return False

    def _wait_registered(self, timeout: float) -> None:
        """Wait until the webhook configurations point at this server's port."""
        from kubernetes import config

        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        adm = client.AdmissionregistrationV1Api(api)
        want = f":{self.webhook_port}/"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                hooks = adm.read_validating_webhook_configuration("reversi.dev").webhooks or []
                if hooks and all(want in (h.client_config.url or "") for h in hooks):
                    return
            except ApiException as err:
                if err.status != 404:
                    raise
            time.sleep(0.1)
        raise RuntimeError(f"the admission server's webhooks were not registered in {timeout:.0f}s; see {self.log}")


class AdmissionPool:
    """``replicas`` admission servers on one webhook port (``SO_REUSEPORT``: the kernel spreads the
    API server's connections over them, and a replica that dies leaves the others serving), as the
    chart's Deployment runs them behind a Service. They share a CA and serving certificate (in
    ``<log stem>-webhook-certs``), so each one's registration of the webhooks is the same.
    ``metrics_port``: replica ``i`` serves its /metrics on ``metrics_port + i`` (0: off)."""

    def __init__(self, kubeconfig: Path, log: Path, webhook_port: int, replicas: int = 2, metrics_port: int = 0):
        cert_dir = log.parent / f"{log.stem}-webhook-certs"
        self.replicas = [AdmissionProcess(kubeconfig, log.with_name(f"{log.stem}-{i}.log"), webhook_port,
                                          metrics_port=metrics_port + i if metrics_port else 0)
                         for i in range(replicas)]
        for replica in self.replicas:
            replica.cert_dir = cert_dir
        self.log = self.replicas[0].log

    def start(self, timeout: float = 30) -> None:
        """Start the replicas that are not running, one after another (the first makes the CA)."""
        for replica in self.replicas:
            if not replica.alive():
                replica.start(timeout)

    def kill(self) -> None:
        """SIGKILL every replica (no admission server left: writes of Reversi's kinds are refused)."""
        for replica in self.replicas:
            replica.kill()

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()

    def alive(self) -> bool:
        """Whether every replica runs."""
        return all(replica.alive() for replica in self.replicas)


class OperatorProcess(_Process):
    """``reversi-operator`` as a child process: :meth:`start`, :meth:`kill` (SIGKILL, like a
    crash), :meth:`stop` (SIGTERM). Its output goes to ``log``. With a ``webhook_port`` it brings
    the admission webhooks up too, in processes of their own (:attr:`admission`, an
    :class:`AdmissionPool` of ``admission_replicas``, logging beside ``log``): :meth:`kill` ends
    only the operator, as a crash of its pod would, while :meth:`stop` ends both. ``identity``: its
    name in the operator's Lease (a pod's name; default: the log's stem and a random suffix), the
    same across restarts of this object, as a pod's name is across restarts of its container: a
    restarted operator takes its Lease back at once (docs/operations.md#leader-election)."""

    def __init__(self, kubeconfig: Path, log: Path, metrics_port: int = 0, webhook_port: int = 0,
                 tick_seconds: float = 0.5, admission_replicas: int = 2, admission_metrics_port: int = 0,
                 identity: str | None = None):
        self.kubeconfig = kubeconfig
        self.identity = identity or f"{log.stem}-{os.urandom(3).hex()}"
        self.log = log
        self.metrics_port = metrics_port
        self.webhook_port = webhook_port
        self.tick_seconds = tick_seconds
        self.admission = (AdmissionPool(kubeconfig, log.with_name(f"{log.stem}-admission.log"), webhook_port,
                                        replicas=admission_replicas, metrics_port=admission_metrics_port)
                          if webhook_port else None)

    def start(self, timeout: float = 30) -> None:
        """Start the operator (and its admission server, unless it runs). Raises ``RuntimeError``
        naming the log when either exits or does not come up."""
        if self.admission is not None and not self.admission.alive():
            self.admission.start(timeout)
        env = {"REVERSI_GAUGE_REFRESH_SECONDS": "2", **os.environ, "PYTHONUNBUFFERED": "1",
               "REVERSI_TICK_SECONDS": str(self.tick_seconds), "REVERSI_LEADER_IDENTITY": self.identity}
        self._spawn("reversi.entrypoints.operator",
                    ["--kubeconfig", str(self.kubeconfig), "--metrics-port", str(self.metrics_port)],
                    env, "operator", timeout)

    def _ready(self) -> bool:
        """The operator's start-up activity has run: its /metrics port answers (without a metrics
        port there is nothing to wait on)."""
        if not self.metrics_port:
            return True
        try:
            with socket.create_connection(("127.0.0.1", self.metrics_port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM the operator and its admission server, then SIGKILL what is left after 15 seconds."""
        super().stop()
        if self.admission is not None:
            self.admission.stop()
