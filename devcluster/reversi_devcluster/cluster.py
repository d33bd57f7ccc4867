"""Start, stop and inspect the local control plane on loopback.

Components, each a process of its own with its log in ``<state>/logs/<component>.log``:

- ``etcd`` (built from the pinned release) with its data in ``<state>/etcd``;
- ``kube-apiserver`` on ``https://127.0.0.1:<port>`` with client-certificate authentication,
  RBAC authorization and service-account token signing;
- ``kube-controller-manager`` running the job, garbage-collector, namespace, serviceaccount,
  serviceaccount-token, root-ca-cert-publisher and ttl-after-finished controllers, and the
  deployment, replicaset, endpoints and endpointslice controllers (for the operator installed by
  its Helm chart; with no kube-proxy, the API server reaches Services through their endpoints),
  and the resourcequota controller (object count quotas, such as the journal's ceiling), and the
  persistent volume binder and protection controllers (claims bound and deleted);
- ``node-agent`` (:mod:`reversi_devcluster.nodeagent`), standing in for a kubelet; or, with
  ``REVERSI_REAL_NODE=1`` (``reversi-devcluster up --real-node``), a real node
  (:mod:`reversi_devcluster.realnode`): containerd, the kubelet, kube-scheduler and kube-proxy,
  with pods in real containers of images built here.

The state folder is ``$REVERSI_CLUSTER_DIR`` or ``~/.cache/reversi/cluster``. Ports come from
:class:`ClusterSettings` (environment variables ``REVERSI_APISERVER_PORT``,
``REVERSI_ETCD_PORT``, ``REVERSI_ETCD_PEER_PORT``, ``REVERSI_KUBELET_PORT``).

Every failure raises :class:`ClusterError` naming the component and its log; ``down`` stops
every process it started, whatever state ``up`` reached.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from . import build, nodeagent, pki, realnode

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
#: the components of a cluster with the node agent (the default)
COMPONENTS = (*CONTROL_PLANE, "node-agent")
#: every component a cluster folder may have a process of, in start order
ALL_COMPONENTS = (*COMPONENTS, *realnode.COMPONENTS)
NODE_NAME = "reversi-node"
SERVICE_CIDR = "10.96.0.0/24"
SERVICE_IP = "10.96.0.1"


class ClusterError(RuntimeError):
    """A component failed; the message names it and the log to read."""


class ClusterSettings(BaseSettings):
    """Knobs of the local control plane, read from ``REVERSI_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="REVERSI_")

    cluster_dir: Path = Field(
        default_factory=lambda: build.cache_root() / "cluster",
        description="Folder for certificates, kubeconfigs, etcd data, logs and pids.",
    )
    apiserver_port: int = Field(16443, description="kube-apiserver secure port on 127.0.0.1.")
    etcd_port: int = Field(12379, description="etcd client port on 127.0.0.1.")
    etcd_peer_port: int = Field(12380, description="etcd peer port on 127.0.0.1.")
    kubelet_port: int = Field(20250, description="node agent's kubelet API port (logs).")
    start_timeout: float = Field(90.0, description="Seconds to wait for each component.")
    real_node: bool = Field(False, description="Run a real node (containerd, kubelet, kube-scheduler, kube-proxy) "
                                               "instead of the node agent.")
    node_bridge: str = Field("reversi0", min_length=1, max_length=15, pattern=r"^[A-Za-z0-9_.-]+$",
                             description="The real node's pod bridge (a Linux interface name: at most 15 characters).")
    node_pod_cidr: str = Field("10.244.0.0/24", description="The real node's pod addresses.")
    job_sync_batch_period: str = Field(
        "100ms", pattern=r"^(0*[1-9][0-9]*(\.[0-9]+)?|0*\.[0-9]*[1-9][0-9]*)(ns|us|ms|s)$",
        description="How long the Job controller gathers pod events before it syncs a Job (a Go duration; "
                    "upstream's default is 1s, its own integration tests use 100ms): a Job's create to Complete "
                    "takes about three of these, docs/development.md#components.")
    apiserver_extra_args: list[str] = Field(
        default_factory=list, description="Extra kube-apiserver flags (JSON list), e.g. feature gates.")


@dataclass(frozen=True)
class Paths:
    """Where the cluster keeps its files."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def node(self) -> Path:
        return self.root / "node"

    @property
    def kubeconfigs(self) -> Path:
        return self.root / "kubeconfigs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfigs / "admin.yaml"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def pid(self, component: str) -> Path:
        return self.pids / f"{component}.pid"


class Cluster:
    """The local control plane: ``up()``, ``down()``, ``status()`` and kubeconfigs."""

    def __init__(self, settings: ClusterSettings | None = None):
        self.settings = settings or ClusterSettings()
        self.paths = Paths(self.settings.cluster_dir)
        self.real = realnode.RealNode(self)

    @property
    def components(self) -> tuple[str, ...]:
        """This cluster's components in start order: the control plane, then the node agent or
        the real node's parts (``settings.real_node``, or a real node already runs in this folder:
        ``status`` and ``up`` then see it as it is)."""
        real = self.settings.real_node or any(self.paths.pid(comp).exists() for comp in realnode.COMPONENTS)
        return (*CONTROL_PLANE, *realnode.COMPONENTS) if real else COMPONENTS

    @property
    def node_name(self) -> str:
        return NODE_NAME

    def kubelet_serving_pair(self, host_ip: str) -> pki.KeyPair:
        """The real kubelet's serving certificate (its node name and ``host_ip``, the address the
        API server reaches it at for logs and exec)."""
        return pki.issue(self.ca, self.paths.pki, f"kubelet-{host_ip}", f"system:node:{NODE_NAME}",
                         dns_names=("localhost", NODE_NAME), ip_addresses=("127.0.0.1", host_ip), server=True)

    # ----- identities -------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.settings.apiserver_port}"

    @property
    def ca(self) -> pki.KeyPair:
        return pki.make_ca(self.paths.pki)

    def kubeconfig_for(self, user: str, groups: tuple[str, ...] = (), name: str | None = None) -> Path:
        """Write a kubeconfig that authenticates as ``user`` in ``groups``; return its path.

        The identity is a client certificate signed by the cluster CA (CN = user,
        O = groups), so the API server sees exactly that user; RBAC decides what it may do.
        """
        stem = name or _safe(user + ("-" + "-".join(groups) if groups else ""))
        pair = pki.issue(
            self.ca, self.paths.pki / "users", stem, user, organizations=tuple(groups), client=True
        )
        path = self.paths.kubeconfigs / f"{stem}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "reversi-local", "cluster": {
                "server": self.server, "certificate-authority": str(self.ca.cert)}}],
            "users": [{"name": user, "user": {
                "client-certificate": str(pair.cert), "client-key": str(pair.key)}}],
            "contexts": [{"name": "reversi-local", "context": {
                "cluster": "reversi-local", "user": user}}],
            "current-context": "reversi-local",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def _prepare_pki(self) -> dict[str, pki.KeyPair]:
        d = self.paths.pki
        ca = self.ca
        return {
            "ca": ca,
            "apiserver": pki.issue(
                ca, d, "apiserver", "kube-apiserver",
                dns_names=("localhost", "kubernetes", "kubernetes.default",
                           "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"),
                ip_addresses=("127.0.0.1", SERVICE_IP), server=True,
            ),
            "apiserver-kubelet-client": pki.issue(
                ca, d, "apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                organizations=("system:masters",), client=True,
            ),
            "kubelet": pki.issue(
                ca, d, "kubelet", f"system:node:{NODE_NAME}",
                dns_names=("localhost", NODE_NAME), ip_addresses=("127.0.0.1",), server=True,
            ),
            "sa": pki.make_service_account_keys(d),
        }

    # ----- lifecycle --------------------------------------------------------------------

    def up(self, *, log=print) -> None:
        """Build what is missing and start every component; return when the node is Ready.

        Reuses a cluster that is already running. Raises :class:`ClusterError` (after
        stopping what it started) naming the failing component and its log.
        """
        if self.is_running():
            self._reuse(log)
            return
        if self.settings.real_node and (why := realnode.unsupported()):
            raise ClusterError(f"no real node on this machine: {why}")
        if self.settings.real_node and (other := realnode.running_elsewhere(self.paths.root)):
            raise ClusterError(f"a real node of the cluster in {other} runs on this machine, and there can be one: "
                               f"stop it first (REVERSI_CLUSTER_DIR={other} reversi-devcluster down)")
        self.down(quiet=True)
        build.build(list(build.CONTROL_PLANE_COMPONENTS))
        if self.settings.real_node:
            self.real.build(log=log)
        for p in (self.paths.logs, self.paths.pids, self.paths.node, self.paths.kubeconfigs):
            p.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.paths.etcd_data, ignore_errors=True)
        for comp in self.components:
            self.paths.log(comp).write_text("")
        s = self.settings
        for comp, port in (("etcd", s.etcd_port), ("etcd", s.etcd_peer_port),
                           ("kube-apiserver", s.apiserver_port), ("node-agent", s.kubelet_port)):
            if _port_in_use(port):
                raise ClusterError(
                    f"{comp}: port {port} on 127.0.0.1 is in use; stop what holds it "
                    f"(`ss -ltnp 'sport = :{port}'`) or choose another port with the "
                    f"REVERSI_*_PORT variables (reversi-devcluster --help)"
                )
        certs = self._prepare_pki()
        admin = self.kubeconfig_for("reversi-admin", ("system:masters",), name="admin")
        if self.settings.real_node:
            self.real.prepare(_host_ip())
        started = time.monotonic()
        try:
            self._start_all(certs, log)
        except BaseException:
            self.down(quiet=True)
            raise
        log(f"control plane up at {self.server} in {time.monotonic() - started:.1f}s")
        log(f"export KUBECONFIG={admin}")

    def _start_all(self, certs: dict[str, pki.KeyPair], log) -> None:
        """Start every component in order, each waited for; on a real node, also its images and
        the cluster DNS (its objects as soon as the API server answers: its pod then starts as
        soon as the node is ready, and ``up`` waits for it last)."""
        for comp in self.components:
            self._start(comp, *self._command(comp, certs))
            if comp != "kube-controller-manager":  # ready once the node is (its service accounts)
                self._wait(comp, self._ready_check(comp, first=True))
            if comp == "containerd":
                self.real.load_images(log=log)
            if comp == "kube-apiserver" and self.settings.real_node:
                self._dns(apply=True)
        self._wait("kube-controller-manager", self._default_serviceaccount_exists)
        if self.settings.real_node:
            self._dns(log=log)

    def _reuse(self, log) -> None:
        """``up`` of a running cluster: on a real node, pods started from now on run this
        checkout's images, and the cluster DNS is there; else a node agent started from another
        checkout (its ``PYTHONPATH``) is restarted, so that containers run this checkout's code."""
        log(f"control plane already running at {self.server}")
        if not self.settings.real_node and "node-agent" in self.components:
            running = _environ_of(self.paths.pid("node-agent")).get("PYTHONPATH")
            if running is not None and running != nodeagent.python_path():
                log(f"the node agent runs {running}, not this checkout: restarting it")
                self.restart(["node-agent"], kill=False, log=log)
        if self.settings.real_node:
            self.real.build(log=log)
            self.real.load_images(log=log)
            self._dns(apply=True)
            self._dns(log=log)

    def _dns(self, *, apply: bool = False, log=print) -> None:
        """The real node's cluster DNS: create its objects (``apply``), else wait until it answers
        (:class:`reversi_devcluster.realnode.RealNode`); raises :class:`ClusterError` when it does
        not come up."""
        try:
            if apply:
                self.real.apply_dns()
            else:
                self.real.wait_dns(self.settings.start_timeout, log=log)
        except RuntimeError as err:
            raise ClusterError(str(err)) from None

    def down(self, *, quiet: bool = False, log=print) -> None:
        """Stop every component this folder's pid files name (reverse start order).

        Sends SIGTERM to each process group, then SIGKILL after a grace period; removes the
        pid files and etcd's data, so the next ``up`` starts from an empty cluster. A real node's
        pods are removed through the CRI before containerd stops, and the host is put back as
        it was (:meth:`reversi_devcluster.realnode.RealNode.clean_up`).
        """
        real = self.real.root.exists()
        for comp in reversed(ALL_COMPONENTS):
            pidfile = self.paths.pid(comp)
            if not pidfile.exists():
                continue
            pid = int(pidfile.read_text().strip() or 0)
            if pid and _alive(pid) and self._ours(pid):
                if comp == "containerd":
                    self.real.remove_pods()
                _terminate_group(pid, grace=10.0 if comp in ("node-agent", "kubelet", "containerd") else 5.0)
                if not quiet:
                    log(f"stopped {comp} (pid {pid})")
            pidfile.unlink(missing_ok=True)
        if real:
            self.real.clean_up(log=(lambda _m: None) if quiet else log)
        shutil.rmtree(self.paths.etcd_data, ignore_errors=True)

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` is still a process of this cluster (its command line names the cluster
        folder): a stale pid file must never make ``down`` kill an unrelated process."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return False
        return str(self.paths.root) in cmdline

    def status(self) -> dict[str, dict]:
        """Each component's pid, whether it is alive, and its log path."""
        out = {}
        for comp in self.components:
            pidfile = self.paths.pid(comp)
            pid = int(pidfile.read_text().strip() or 0) if pidfile.exists() else None
            out[comp] = {
                "pid": pid,
                "running": bool(pid and _alive(pid) and self._ours(pid)),
                "log": str(self.paths.log(comp)),
            }
        return out

    def is_running(self) -> bool:
        """True when every component is alive and the API server answers ``/readyz``."""
        return all(c["running"] for c in self.status().values()) and self._apiserver_ready()

    def restart(self, components, *, kill: bool = True, down_seconds: float = 0.0, log=print) -> float:
        """Stop the named components and start them again with the same command, state and ports;
        return when each is ready again, with the seconds the restart took.

        ``components``: names from :data:`COMPONENTS`, in any order (an unknown name raises
        :class:`ClusterError` before anything is stopped). They are stopped in reverse start order
        — ``kill=True`` sends SIGKILL to each process group, like a crash; ``kill=False`` SIGTERM,
        then SIGKILL after a grace period — kept down ``down_seconds``, then started in start
        order, each waited for: etcd answers ``/health`` (its data folder is kept, so the cluster's
        objects survive), kube-apiserver ``/readyz``, kube-controller-manager has started its job
        controller, the node agent has posted a fresh heartbeat. The node agent keeps its state
        folder: at start it kills the pod processes its killed predecessor left running and marks
        the pods that were running ``Failed`` (reason ``NodeAgentRestarted``), so they are lost,
        as on a node that crashed, and never run twice. The other components are not touched:
        kube-apiserver alone restarted cuts every watch and connection of every client.
        Raises :class:`ClusterError` when the cluster is not up or a component does not come back.
        """
        names = set(components)
        unknown = sorted(names - set(self.components))
        if unknown:
            raise ClusterError(f"no component {', '.join(unknown)}; the components are {', '.join(self.components)}")
        if not self.paths.admin_kubeconfig.exists():
            raise ClusterError(f"the control plane in {self.paths.root} is not up; run `reversi-devcluster up` first")
        started = time.monotonic()
        order = [comp for comp in self.components if comp in names]
        for comp in reversed(order):
            self._stop(comp, kill=kill)
            log(f"{'killed' if kill else 'stopped'} {comp}")
        if down_seconds > 0:
            time.sleep(down_seconds)
        self.start_stopped(order, log=log)
        return time.monotonic() - started

    def stop(self, components, *, kill: bool = True, log=print) -> None:
        """Stop the named components (as :meth:`restart` does, without starting them again): a
        test keeps them down while it waits for a condition, then calls :meth:`start_stopped`.
        Raises :class:`ClusterError` for an unknown name, before anything is stopped."""
        unknown = sorted(set(components) - set(self.components))
        if unknown:
            raise ClusterError(f"no component {', '.join(unknown)}; the components are {', '.join(self.components)}")
        for comp in reversed([comp for comp in self.components if comp in set(components)]):
            self._stop(comp, kill=kill)
            log(f"{'killed' if kill else 'stopped'} {comp}")

    def start_stopped(self, components=ALL_COMPONENTS, *, log=print) -> list[str]:
        """Start those of ``components`` that are not running (same command, state and ports as
        ``up``; etcd's data kept) in start order, each waited for as in :meth:`restart`; return
        their names. What a test that kills components calls in its ``finally``, so the cluster is
        whole again for the tests after it. Raises :class:`ClusterError` like :meth:`restart`."""
        certs = self._prepare_pki()
        status = self.status()
        stopped = [comp for comp in self.components if comp in components and not status[comp]["running"]]
        for comp in stopped:  # what is left of a dead one goes first (its pid file, a child)
            self._stop(comp, kill=True)
        started = []
        for comp in stopped:
            since = time.time()
            offset = self.paths.log(comp).stat().st_size if self.paths.log(comp).exists() else 0
            self._wait_ports_free(comp)  # a killed predecessor's sockets may outlive it for a moment
            before = self._node_boot_id() if comp == "node-agent" else None
            self._start(comp, *self._command(comp, certs))
            ready = self._ready_check(comp, first=False, since=since, log_offset=offset)
            if comp == "node-agent":  # the node's Ready heartbeat of the agent just started, not of the killed one
                ready = (lambda check, old: lambda: check() and self._node_boot_id() != old)(ready, before)
            self._wait(comp, ready)
            log(f"started {comp} (pid {self.paths.pid(comp).read_text().strip()})")
            started.append(comp)
        return started

    def _ports(self, comp: str) -> list[int]:
        """The ports on 127.0.0.1 that ``comp`` listens on (those ``up`` checks are free)."""
        s = self.settings
        return {"etcd": [s.etcd_port, s.etcd_peer_port], "kube-apiserver": [s.apiserver_port],
                "node-agent": [s.kubelet_port]}.get(comp, [])

    def _wait_ports_free(self, comp: str, timeout: float = 15.0) -> None:
        """Wait until no socket holds ``comp``'s ports (the kernel frees them when the last
        process of a killed group is gone, which can be a moment after its leader); raises
        :class:`ClusterError` naming the port after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        for port in self._ports(comp):
            while _port_in_use(port):
                if time.monotonic() > deadline:
                    raise ClusterError(f"{comp}: port {port} on 127.0.0.1 is still in use {timeout:.0f}s after its "
                                       f"process was stopped (`ss -ltnp 'sport = :{port}'` shows what holds it)")
                time.sleep(0.05)

    def _stop(self, comp: str, *, kill: bool) -> None:
        pidfile = self.paths.pid(comp)
        if not pidfile.exists():
            return
        pid = int(pidfile.read_text().strip() or 0)
        if pid and _alive(pid) and self._ours(pid):
            if kill:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                deadline = time.monotonic() + 10
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)
            else:
                _terminate_group(pid, grace=10.0 if comp in ("node-agent", "kubelet", "containerd") else 5.0)
        pidfile.unlink(missing_ok=True)

    def _command(self, comp: str, certs: dict[str, pki.KeyPair]) -> tuple[list[str], dict[str, str] | None]:
        """The command line (and extra environment) that starts ``comp``."""
        s = self.settings
        if comp == "etcd":
            return self._etcd_cmd(), None
        if comp == "kube-apiserver":
            return self._apiserver_cmd(certs), None
        if comp == "kube-controller-manager":
            kcm = self.kubeconfig_for("system:kube-controller-manager", name="controller-manager")
            return self._kcm_cmd(certs, kcm), {"REVERSI_JOB_SYNC_BATCH_PERIOD": s.job_sync_batch_period}
        if comp in realnode.COMPONENTS:
            return self.real.command(comp, _host_ip()), None
        node = self.kubeconfig_for(
            f"system:node:{NODE_NAME}", ("system:nodes", "system:masters"), name="node-agent"
        )
        return [
            sys.executable, "-m", "reversi_devcluster.nodeagent",
            "--kubeconfig", str(node), "--node-name", NODE_NAME,
            "--state-dir", str(self.paths.node), "--port", str(s.kubelet_port),
            "--tls-cert", str(certs["kubelet"].cert), "--tls-key", str(certs["kubelet"].key),
            "--client-ca", str(certs["ca"].cert),
            "--apiserver-host", "127.0.0.1", "--apiserver-port", str(s.apiserver_port),
        ], {"PYTHONPATH": nodeagent.python_path()}

    def _ready_check(self, comp: str, *, first: bool, since: float = 0.0, log_offset: int = 0):
        """A callable that says whether ``comp`` is ready: on first start (``first``) or after a
        restart at epoch ``since`` (its log then read from ``log_offset``)."""
        if comp == "etcd":
            return lambda: http_ok(f"http://127.0.0.1:{self.settings.etcd_port}/health")
        if comp == "kube-apiserver":
            return self._apiserver_ready
        if comp == "kube-controller-manager":
            return lambda: b"Starting job controller" in _read_from(self.paths.log(comp), log_offset)
        if comp == "kube-scheduler":  # read from its start: after a restart, the old line says nothing
            return lambda: b"Starting Kubernetes Scheduler" in _read_from(self.paths.log(comp), log_offset)
        if comp in realnode.COMPONENTS:
            return self.real.ready_check(comp)
        if first:
            return self._node_ready
        return lambda: self._node_ready(since=since)

    # ----- commands ---------------------------------------------------------------------

    def _etcd_cmd(self) -> list[str]:
        s = self.settings
        return [
            str(build.binary("etcd")),
            "--name", "reversi", "--data-dir", str(self.paths.etcd_data),
            "--listen-client-urls", f"http://127.0.0.1:{s.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{s.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{s.etcd_peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{s.etcd_peer_port}",
            "--initial-cluster", f"reversi=http://127.0.0.1:{s.etcd_peer_port}",
            "--unsafe-no-fsync", "--quota-backend-bytes", str(4 * 1024**3),
            # large Runs (thousands of steps) exceed etcd's default 1.5 MiB request limit
            "--max-request-bytes", str(4 * 1024**2),
            "--log-level", "warn",
        ]

    def _apiserver_cmd(self, c: dict[str, pki.KeyPair]) -> list[str]:
        s = self.settings
        # a real node's pods reach the API server through the kubernetes Service (kube-proxy), whose
        # endpoint cannot be a loopback address; its kubelet is authorized as a node (Node, NodeRestriction)
        real = ["--bind-address=0.0.0.0", f"--advertise-address={_host_ip()}", "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction"]
        loopback = ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--authorization-mode=RBAC"]
        return [
            str(build.binary("kubernetes", "kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{s.etcd_port}",
            *(real if s.real_node else loopback),
            f"--secure-port={s.apiserver_port}",
            f"--tls-cert-file={c['apiserver'].cert}", f"--tls-private-key-file={c['apiserver'].key}",
            f"--client-ca-file={c['ca'].cert}",
            f"--service-account-key-file={c['sa'].cert}",
            f"--service-account-signing-key-file={c['sa'].key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--kubelet-client-certificate={c['apiserver-kubelet-client'].cert}",
            f"--kubelet-client-key={c['apiserver-kubelet-client'].key}",
            f"--kubelet-certificate-authority={c['ca'].cert}",
            "--kubelet-preferred-address-types=InternalIP",
            # no kube-proxy: the API server reaches webhook Services through their endpoints
            "--enable-aggregator-routing=true",
            "--allow-privileged=false", "--profiling=false", "--v=1",
            *s.apiserver_extra_args,
        ]

    def _kcm_cmd(self, c: dict[str, pki.KeyPair], kubeconfig: Path) -> list[str]:
        return [
            str(build.binary("controller-manager")),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--controllers=job-controller,garbage-collector-controller,namespace-controller,"
            "serviceaccount-controller,serviceaccount-token-controller,"
            "root-ca-certificate-publisher-controller,ttl-after-finished-controller,"
            # for the operator installed by its Helm chart: Deployments and Services
            "deployment-controller,replicaset-controller,endpoints-controller,endpointslice-controller,"
            "clusterrole-aggregation-controller,"
            # ResourceQuota usage (the journal's ceiling per namespace: count/runsteps.reversi.dev)
            "resourcequota-controller,"
            # claims bound to volumes, and deleted once no pod uses them (the API server adds their
            # protection finalizers): the built-in kube family records an agent's delete of a claim
            "persistentvolume-binder-controller,persistentvolume-protection-controller,"
            "persistentvolumeclaim-protection-controller"
            # a real node's not-ready taint is lifted (and put back when its kubelet stops reporting)
            + (",node-lifecycle-controller" if self.settings.real_node else ""),
            f"--service-account-private-key-file={c['sa'].key}",
            f"--root-ca-file={c['ca'].cert}",
            "--use-service-account-credentials=true",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
            "--concurrent-job-syncs=10", "--v=1",
        ]

    # ----- process plumbing -------------------------------------------------------------

    def _start(self, comp: str, cmd: list[str], env: dict[str, str] | None = None) -> None:
        log = self.paths.log(comp).open("ab")
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, **(env or {})}, cwd=self.paths.root,
        )
        self.paths.pid(comp).write_text(str(proc.pid))

    def _wait(self, comp: str, ready) -> None:
        deadline = time.monotonic() + self.settings.start_timeout
        pidfile = self.paths.pid(comp)
        while time.monotonic() < deadline:
            pid = int(pidfile.read_text())
            if not _alive(pid):
                raise ClusterError(self._died(comp))
            for other in self.components:
                opid = self.paths.pid(other)
                if other != comp and opid.exists() and not _alive(int(opid.read_text())):
                    raise ClusterError(self._died(other))
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.25)
        raise ClusterError(
            f"{comp} did not become ready within {self.settings.start_timeout:.0f}s; "
            f"read its log: {self.paths.log(comp)}\n{_tail(self.paths.log(comp))}"
        )

    def _died(self, comp: str) -> str:
        return (f"{comp} exited during start-up; read its log: {self.paths.log(comp)}\n"
                f"{_tail(self.paths.log(comp))}")

    def _admin_ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca.cert))
        users = self.paths.pki / "users"
        ctx.load_cert_chain(str(users / "admin.crt"), str(users / "admin.key"))
        return ctx

    def _get(self, path: str) -> tuple[int, bytes]:
        req = urllib.request.Request(self.server + path)
        try:
            with urllib.request.urlopen(req, context=self._admin_ssl(), timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def _apiserver_ready(self) -> bool:
        try:
            return self._get("/readyz")[0] == 200
        except (OSError, ssl.SSLError):
            return False

    def _node_ready(self, since: float = 0.0) -> bool:
        """The node is Ready, with a heartbeat posted at or after epoch ``since`` (whole seconds)."""
        code, body = self._get(f"/api/v1/nodes/{NODE_NAME}")
        if code != 200:
            return False
        conds = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True"
                   and _epoch(c.get("lastHeartbeatTime")) >= int(since) for c in conds)

    def _node_boot_id(self) -> str | None:
        """The node's ``status.nodeInfo.bootID`` (one per node agent process), or None."""
        try:
            code, body = self._get(f"/api/v1/nodes/{NODE_NAME}")
        except OSError:  # the API server is not answering (yet)
            return None
        if code != 200:
            return None
        return (json.loads(body).get("status", {}).get("nodeInfo") or {}).get("bootID")

    def _default_serviceaccount_exists(self) -> bool:
        return self._get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200


def _host_ip() -> str:
    from .nodeagent import host_ip

    return host_ip()


def _safe(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text)[:80]


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def http_ok(url: str) -> bool:
    """Whether ``url`` answers 200 within 2 s (a component's health endpoint)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _terminate_group(pid: int, grace: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)


def _epoch(timestamp: str | None) -> float:
    """Epoch seconds of an RFC 3339 time of the API (``2024-01-01T00:00:00Z``); 0 when absent."""
    if not timestamp:
        return 0.0
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _read_from(path: Path, offset: int) -> bytes:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read()
    except OSError:
        return b""


def _tail(path: Path, lines: int = 20) -> str:
    text = build.log_tail(path, lines)
    return "--- last lines ---\n" + text if text else ""


def _environ_of(pid_file: Path) -> dict[str, str]:
    """The environment of the process a pid file names ({} when it cannot be read)."""
    try:
        pid = int(pid_file.read_text().split()[0])
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (OSError, ValueError, IndexError):
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
