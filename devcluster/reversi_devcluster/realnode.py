"""A real node for the local control plane: containerd, runc, the CNI plugins, kubelet,
kube-scheduler and kube-proxy on this machine (``reversi-devcluster up --real-node``).

Pods run in real containers: images (built here, :mod:`reversi_devcluster.images`), restricted
security contexts with real user ids and read-only roots, resource limits enforced by the kernel,
probes, termination messages written by the runtime, evictions and OOM kills. The node replaces
the node agent: the real kube-scheduler is the default scheduler, and the controller manager runs
the node-lifecycle controller (it lifts the node's not-ready taint, and taints a node whose
kubelet stopped reporting). Pods reach Services by name: the cluster DNS is CoreDNS
(:meth:`RealNode.apply_dns`, the upstream manifest's objects in ``coredns.yaml``), whose Service
``kube-dns`` the kubelet gives every pod (``clusterDNS``).

Everything the node touches on the host is put back by :meth:`RealNode.clean_up` (what the host
shares, the bridge, iptables and sysctls, only by the node that changed it and while no other real
node runs):

- processes: containerd, the kubelet, kube-scheduler, kube-proxy (the cluster's process groups),
  every container shim and container process (found by the node's socket and cgroup root);
- files and mounts under ``<cluster>/real-node`` (containerd's root and state, the kubelet's root,
  pod logs, CNI configuration and addresses), and the kubelet's links in ``/var/log/containers``;
- the pod bridge (``REVERSI_NODE_BRIDGE``, default ``reversi0``) and the iptables rules of the CNI
  plugins, of kube-proxy (``kube-proxy --cleanup``) and of the kubelet (:data:`KUBELET_CHAINS`; so
  do not run the real node on a machine that is itself a Kubernetes node);
- the sysctls the kubelet, kube-proxy and the bridge plugin change (saved before the first
  start in ``sysctls.json`` and restored);
- cgroups under the kubelet's cgroup root (``/reversi-<cluster folder name>``).

Needs root, cgroups with the memory controller, iptables, and the binaries of
:data:`reversi_devcluster.build.NODE_COMPONENTS`. Where the machine cannot run containers,
:func:`unsupported` says why in one line.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

import yaml

from . import build, images, nodedeps

if TYPE_CHECKING:
    from .cluster import Cluster

#: the processes of the real node, in start order (after the control plane's)
COMPONENTS = ("containerd", "kubelet", "kube-scheduler", "kube-proxy")
#: the kernel settings the node's parts change; saved before the first start, restored by clean_up
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward",
           "net/bridge/bridge-nf-call-iptables", "net/ipv4/conf/all/route_localnet")
CLUSTER_CIDR = "10.244.0.0/16"
#: the cluster DNS: the kube-dns Service's fixed address (in the Service range) and the domain
CLUSTER_DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
#: the manifest of the cluster DNS (CoreDNS, the upstream manifest's objects)
DNS_MANIFEST = Path(__file__).with_name("coredns.yaml")
#: the name of the node's CNI network (in its conflist, and in the comments of the plugins' rules)
NETWORK = "reversi"


def unsupported() -> str | None:
    """Why this machine cannot run the real node (one line, with what to run when a package is
    missing), or None when it can."""
    why = _host_unsupported()
    if why:
        return why
    names = nodedeps.missing()
    if names:
        return (f"the real node needs Debian's {' '.join(names)} (make node-deps, or "
                f"{nodedeps.install_command(names)})")
    return None


def _host_unsupported() -> str | None:
    """What no package can fix: root, and the cgroup memory controller."""
    if os.geteuid() != 0:
        return "the real node needs root (containers, cgroups, iptables and a bridge)"
    if not Path("/sys/fs/cgroup/memory").is_dir() and not _cgroup2_has("memory"):
        return "the real node needs the cgroup memory controller, which this kernel does not offer"
    return None


def make_ready(log=print) -> str | None:
    """Make this machine ready for the real node where it can be: install the missing Debian
    packages (:mod:`reversi_devcluster.nodedeps`, the list ``make node-deps`` installs), saying so
    in one line. Returns why the real node cannot run here (one line, with what to run), or None
    when it can. What the demos call before they choose the node."""
    why = _host_unsupported()
    if why:
        return why
    names = nodedeps.missing()
    if names:
        cannot = nodedeps.cannot_install()
        if cannot:
            return f"the real node needs Debian's {' '.join(names)}, and {cannot}: {nodedeps.install_command(names)}"
        log(f"installing the real node's Debian packages (as make node-deps does): {' '.join(names)}")
        started = time.monotonic()
        try:
            nodedeps.install(names)
        except RuntimeError as err:
            first = str(err).splitlines()[0]
            return f"installing {' '.join(names)} failed ({first}): run make node-deps to see why"
        log(f"installed {' '.join(names)} in {time.monotonic() - started:.0f}s")
    return unsupported()


def running_elsewhere(root: Path) -> Path | None:
    """The cluster folder of another real node on this machine, or None: one whose containerd,
    kubelet or kube-proxy runs (even alone, after a crash of the others), or a sibling folder of
    ``root`` whose node changed the host and was not stopped yet (its ``sysctls.json``). One real
    node per machine: two kube-proxies would each rewrite the other's rules, and the second would
    save the first's sysctls as the host's own."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not args or Path(args[0]).name not in ("kube-proxy", "kubelet", "containerd") or "--config" not in args:
            continue
        at = args.index("--config") + 1
        config = Path(args[at]) if at < len(args) else None
        if config is not None and config.parent.name == "real-node" and config.parent.parent != root:
            return config.parent.parent
    for marker in root.parent.glob("*/real-node/sysctls.json"):
        if marker.parent.parent != root:
            return marker.parent.parent
    return None


def _cgroup2_has(controller: str) -> bool:
    try:
        return controller in Path("/sys/fs/cgroup/cgroup.controllers").read_text().split()
    except OSError:
        return False


class RealNode:
    """The real node of ``cluster``: its configuration, commands, readiness and clean-up."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.settings = cluster.settings
        self.root = cluster.paths.root / "real-node"
        self.store = images.Store.default()

    # ----- where things are -------------------------------------------------------------

    @property
    def socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        return "/reversi-" + "".join(ch if ch.isalnum() or ch == "-" else "-" for ch in self.cluster.paths.root.name)

    @property
    def pod_cidr(self) -> str:
        return self.settings.node_pod_cidr

    @property
    def bridge(self) -> str:
        return self.settings.node_bridge

    def _ports(self) -> dict[str, int]:
        base = self.settings.kubelet_port
        return {"kubelet": base, "kubelet-healthz": base + 1, "proxy-healthz": base + 2, "proxy-metrics": base + 3}

    # ----- preparing and starting ---------------------------------------------------------

    def build(self, log=print) -> None:
        """Build what is missing: the node's binaries and its images (pause, the Python base,
        the Dockerfile's targets). Raises ``BuildError`` or :class:`images.ImageError`."""
        build.build(list(build.NODE_COMPONENTS))
        started = time.monotonic()
        images.pause(self.store)
        images.coredns(self.store)
        images.project(self.store)
        log(f"images ready in {time.monotonic() - started:.1f}s")

    def prepare(self, host_ip: str) -> None:
        """Write the node's configuration and save the host's sysctls (once: a restart after a
        crash must not save what the node itself set)."""
        for sub in ("containerd", "kubelet", "pod-logs", "cni/net.d", "cni/ipam"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        saved = self.root / "sysctls.json"
        if not saved.exists():
            saved.write_text(json.dumps({key: _sysctl(key) for key in SYSCTLS if _sysctl(key) is not None}))
        _set_sysctl("net/bridge/bridge-nf-call-iptables", "1")  # Service traffic between pods of one bridge
        self._make_cgroup_root()
        self._write_containerd_config()
        self._write_cni_config()
        self._write_kubelet_config(host_ip)
        self._write_proxy_config(host_ip)

    def _write_containerd_config(self) -> None:
        runc = build.binary("runc")
        cni_bin = build.components()["cni-plugins"].bindir
        state = self.root / "containerd" / "state"
        config = f"""version = 3
root = "{self.root / 'containerd' / 'root'}"
state = "{state}"

[grpc]
  address = "{self.socket}"

[ttrpc]
  address = "{self.root / 'containerd' / 'containerd.sock.ttrpc'}"

[debug]
  level = "warn"

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{images.PAUSE_IMAGE}"
  [plugins.'io.containerd.cri.v1.runtime']
    # the sandbox's oom_score_adj of -998 needs CAP_SYS_RESOURCE, which a VM's bounding set may lack
    restrict_oom_score_adj = true
    disable_apparmor = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "{runc}"
          Root = "{state / 'runc'}"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["{cni_bin}"]
      conf_dir = "{self.root / 'cni' / 'net.d'}"
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
"""
        (self.root / "containerd.toml").write_text(config)

    def _write_cni_config(self) -> None:
        conf = {"cniVersion": "1.0.0", "name": NETWORK, "plugins": [
            {"type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": True, "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_cidr}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.root / "cni" / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ]}
        (self.root / "cni" / "net.d" / "10-reversi.conflist").write_text(json.dumps(conf, indent=2))

    def _write_kubelet_config(self, host_ip: str) -> None:
        pki = self.cluster.paths.pki
        ports = self._ports()
        serving = self.cluster.kubelet_serving_pair(host_ip)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            "failSwapOn": False, "protectKernelDefaults": False,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": host_ip, "port": ports["kubelet"], "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": ports["kubelet-healthz"],
            "tlsCertFile": str(serving.cert), "tlsPrivateKeyFile": str(serving.key),
            "authentication": {"x509": {"clientCAFile": str(pki / "ca.crt")}, "webhook": {"enabled": True},
                               "anonymous": {"enabled": False}},
            "authorization": {"mode": "Webhook"},
            "podLogsDir": str(self.root / "pod-logs"),
            "serializeImagePulls": False,
            # a small shared disk: evict only when it is nearly full, and never collect the images
            # imported by hand (no registry would give them back)
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "syncFrequency": "10s", "nodeStatusReportFrequency": "10s",
            "resolvConf": "/etc/resolv.conf",
            # pods reach Services by name (payments.shop.svc) through CoreDNS (start_dns)
            "clusterDNS": [CLUSTER_DNS_IP], "clusterDomain": CLUSTER_DOMAIN,
        }
        (self.root / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def _write_proxy_config(self, host_ip: str) -> None:
        ports = self._ports()
        kubeconfig = self.cluster.kubeconfig_for("system:kube-proxy", name="kube-proxy")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "iptables", "clusterCIDR": CLUSTER_CIDR, "hostnameOverride": self.cluster.node_name,
            "bindAddress": host_ip, "healthzBindAddress": f"127.0.0.1:{ports['proxy-healthz']}",
            "metricsBindAddress": f"127.0.0.1:{ports['proxy-metrics']}",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            # leave the host's conntrack table and timeouts as they are
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"localhostNodePorts": False},
        }
        (self.root / "kube-proxy.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    def command(self, comp: str, host_ip: str) -> list[str]:
        """The command line that starts ``comp`` (one of :data:`COMPONENTS`)."""
        if comp == "containerd":
            return [str(build.binary("containerd")), "--config", str(self.root / "containerd.toml")]
        if comp == "kubelet":
            kubeconfig = self.cluster.kubeconfig_for(f"system:node:{self.cluster.node_name}", ("system:nodes",),
                                                     name="kubelet")
            return [str(build.binary("node", "kubelet")), "--config", str(self.root / "kubelet.yaml"),
                    "--kubeconfig", str(kubeconfig), "--root-dir", str(self.root / "kubelet"),
                    "--node-ip", host_ip, "--hostname-override", self.cluster.node_name, "--v=1"]
        if comp == "kube-scheduler":
            kubeconfig = self.cluster.kubeconfig_for("system:kube-scheduler", name="kube-scheduler")
            return [str(build.binary("node", "kube-scheduler")), f"--kubeconfig={kubeconfig}",
                    f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
                    "--leader-elect=false", "--secure-port=0", "--v=1"]
        return [str(build.binary("node", "kube-proxy")), "--config", str(self.root / "kube-proxy.yaml"), "--v=1"]

    def ready_check(self, comp: str):
        """A callable that says whether ``comp`` (containerd, kubelet, kube-proxy) is ready; the
        cluster reads kube-scheduler's readiness from its log."""
        if comp == "containerd":
            return self._containerd_ready
        if comp == "kubelet":
            return self._node_schedulable
        from .cluster import http_ok

        port = self._ports()["proxy-healthz"]
        return lambda: http_ok(f"http://127.0.0.1:{port}/healthz")

    def _containerd_ready(self) -> bool:
        return self._ctr("version").returncode == 0

    def _node_schedulable(self) -> bool:
        """The node is Ready and carries no not-ready taint (the node-lifecycle controller lifts it)."""
        code, body = self.cluster._get(f"/api/v1/nodes/{self.cluster.node_name}")
        if code != 200:
            return False
        node = json.loads(body)
        conditions = node.get("status", {}).get("conditions", [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        taints = [t["key"] for t in node.get("spec", {}).get("taints") or []]
        return ready and "node.kubernetes.io/not-ready" not in taints

    def load_images(self, log=print) -> None:
        """Copy the built images into the node's containerd (those not there yet)."""
        refs = [images.PAUSE_IMAGE, images.coredns_image(), *images.PROJECT_IMAGES.values()]
        started = time.monotonic()
        copied = images.load(self.store, refs, build.binary("containerd", "ctr"), self.socket,
                             self.root / "images.json")
        if copied:
            log(f"imported {', '.join(copied)} into the node's containerd in {time.monotonic() - started:.1f}s")

    def dns_objects(self) -> list[dict]:
        """The cluster DNS's objects (:data:`DNS_MANIFEST`, filled in)."""
        text = Template(DNS_MANIFEST.read_text()).substitute(
            IMAGE=images.coredns_image(), CLUSTER_DNS_IP=CLUSTER_DNS_IP, CLUSTER_DOMAIN=CLUSTER_DOMAIN)
        return [doc for doc in yaml.safe_load_all(text) if doc]

    def apply_dns(self) -> None:
        """Create the cluster DNS's objects that are missing (a reused cluster has them). ``up``
        does it as soon as the API server answers, so CoreDNS's pod starts with the node, not
        after it. Raises ``RuntimeError`` naming the object that could not be created."""
        from kubernetes import config, utils

        api = config.new_client_from_config(config_file=str(self.cluster.paths.admin_kubeconfig))
        for obj in self.dns_objects():
            try:
                utils.create_from_dict(api, obj)
            except utils.FailToCreateError as err:
                if any(e.status != 409 for e in err.api_exceptions):  # 409: there already
                    raise RuntimeError(f"cluster DNS: creating {obj['kind']} {obj['metadata']['name']} failed: "
                                       f"{err}") from None
        self._dns_applied = time.monotonic()

    def wait_dns(self, timeout: float, log=print) -> None:
        """Wait until CoreDNS is ready to answer (its readiness probe: the kubernetes plugin has
        synced with the API server). Raises ``RuntimeError`` saying where to look."""
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(self.cluster.paths.admin_kubeconfig))
        apps = client.AppsV1Api(api)
        started = time.monotonic()
        deadline = started + timeout
        while (apps.read_namespaced_deployment("coredns", "kube-system").status.ready_replicas or 0) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster DNS: CoreDNS was not ready in {timeout:.0f}s (kubectl -n kube-system "
                                   f"describe pod -l k8s-app=kube-dns; kubelet log: "
                                   f"{self.cluster.paths.log('kubelet')})")
            time.sleep(0.25)
        since = time.monotonic() - getattr(self, "_dns_applied", started)
        log(f"cluster DNS ready {since:.1f}s after its objects were applied (waited {time.monotonic() - started:.1f}s "
            f"for it at the end; CoreDNS, Service kube-system/kube-dns at {CLUSTER_DNS_IP}, domain {CLUSTER_DOMAIN})")

    def _ctr(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(build.binary("containerd", "ctr")), "--address", str(self.socket), *args],
                              capture_output=True, text=True, timeout=60)

    # ----- stopping -----------------------------------------------------------------------

    def remove_pods(self) -> None:
        """Stop and remove every pod through the CRI while containerd runs (the CNI plugins then
        release each pod's address and rules). Best effort: what is left, clean_up removes."""
        if not self.socket.exists():
            return
        crictl = [str(build.binary("cri-tools", "crictl")), "--runtime-endpoint", f"unix://{self.socket}",
                  "--timeout", "60s"]
        for _ in range(2):  # a pod whose network teardown was cut short (its request timed out) goes again
            subprocess.run([*crictl, "rmp", "--all", "--force"], capture_output=True, timeout=150)
            left = subprocess.run([*crictl, "pods", "-q"], capture_output=True, text=True, timeout=60).stdout
            if not left.strip():
                return

    def clean_up(self, log=print) -> None:
        """Put the host back as it was (see the module docstring), whatever state the node
        reached. Run after the node's processes were stopped.

        What is this node's alone (its processes, mounts, cgroups, pod log links) always goes.
        What the host shares (the bridge, iptables, sysctls) is put back only when this node
        changed it (``sysctls.json``, saved by :meth:`prepare`, is still there) and no other real
        node runs on the machine: that one's pods use the same rules and settings; its own
        ``down`` puts them back."""
        self._kill_leftovers()
        self._unmount_all()
        self._remove_cgroups()
        for link in Path("/var/log/containers").glob("*.log") if Path("/var/log/containers").is_dir() else []:
            try:
                if str(self.root) in os.readlink(link):
                    link.unlink()
            except OSError:
                pass
        for sub in ("containerd/state", "kubelet", "pod-logs", "cni/ipam"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        saved = self.root / "sysctls.json"
        if not saved.exists():
            return
        other = running_elsewhere(self.cluster.paths.root)
        if other is not None:
            log(f"the host's bridge, iptables rules and sysctls are left to the real node of {other}, which runs")
            return
        if shutil.which("iptables"):
            subprocess.run([str(build.binary("node", "kube-proxy")), "--cleanup"], capture_output=True, timeout=60)
            _drop_cni_rules(self.pod_cidr)
            _drop_kubelet_chains()
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, timeout=30)
        for key, value in json.loads(saved.read_text()).items():
            _set_sysctl(key, value)
        saved.unlink()

    def _kill_leftovers(self) -> None:
        """SIGKILL the container shims of this node's containerd and every process in its cgroups."""
        pids = set()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "containerd-shim" in cmdline and str(self.socket) in cmdline:
                pids.add(int(proc.name))
        for tasks in self._cgroup_dirs():
            try:
                pids.update(int(p) for p in (tasks / "cgroup.procs").read_text().split())
            except OSError:
                pass
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.05)

    def _cgroup_dirs(self) -> list[Path]:
        """The node's cgroup folders, deepest first, in every hierarchy."""
        found: list[Path] = []
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / self.cgroup_root.lstrip("/")
            if top.is_dir():
                found += sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
                found.append(top)
        return found

    def _make_cgroup_root(self) -> None:
        """The kubelet's cgroup root in every hierarchy (the kubelet refuses to start without it);
        a new cpuset starts with the CPUs and memory nodes of its parent, or it could hold no task."""
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            if not hierarchy.is_dir() or hierarchy.name == "unified":
                continue
            top = hierarchy / self.cgroup_root.lstrip("/")
            top.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (top / knob).exists() and not (top / knob).read_text().strip():
                    (top / knob).write_text((hierarchy / knob).read_text())

    def _remove_cgroups(self) -> None:
        for folder in self._cgroup_dirs():
            try:
                folder.rmdir()
            except OSError:
                pass

    def _unmount_all(self) -> None:
        """Unmount everything mounted under the node's folder (pod volumes, container roots,
        network namespaces), deepest first; lazily, so a busy mount cannot block ``down``."""
        root = str(self.root)
        mounts = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == root or point.startswith(root + "/"):
                mounts.append(point)
        for point in sorted(set(mounts), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)


#: the chains a kubelet makes in every table of iptables and ip6tables (its canaries, and the hint
#: that tells other tools which iptables backend it uses)
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")


def _drop_kubelet_chains() -> None:
    """Remove the kubelet's chains (:data:`KUBELET_CHAINS`) and the rules that jump to them."""
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            listed = subprocess.run([tool, "-t", table, "-S"], capture_output=True, text=True, timeout=30).stdout
            for rule in listed.splitlines():
                parts = rule.split()
                if parts[:1] == ["-A"] and "-j" in parts and parts[parts.index("-j") + 1] in KUBELET_CHAINS \
                        and parts[1] not in KUBELET_CHAINS:
                    subprocess.run([tool, "-t", table, "-D", *parts[1:]], capture_output=True, timeout=30)
            for chain in KUBELET_CHAINS:
                if f"-N {chain}" in listed:
                    subprocess.run([tool, "-t", table, "-F", chain], capture_output=True, timeout=30)
                    subprocess.run([tool, "-t", table, "-X", chain], capture_output=True, timeout=30)


def _drop_cni_rules(pod_cidr: str) -> None:
    """Remove the iptables rules the CNI plugins left for pods that were never torn down through
    the CNI (a crash, a teardown cut short): in the nat table, every rule of this node's network
    (its comment names :data:`NETWORK`, or its source or target is in ``pod_cidr``), then every
    ``CNI-`` chain left empty and the jumps to it; the portmap plugin's shared ``CNI-HOSTPORT-``
    chains go once no port mapping is left in ``CNI-HOSTPORT-DNAT``."""
    prefix = pod_cidr.rsplit(".", 1)[0] + "."

    def rules() -> list[list[str]]:
        out = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True, timeout=30).stdout
        return [shlex.split(line) for line in out.splitlines()]  # a plugin's rule carries a quoted comment

    def ours(rule: list[str]) -> bool:
        text = " ".join(rule)
        addresses = [rule[i + 1] for i, arg in enumerate(rule[:-1]) if arg in ("-s", "-d", "--to-destination")]
        return f'name: "{NETWORK}"' in text or any(a.startswith(prefix) for a in addresses)

    def iptables(*args: str) -> None:
        subprocess.run(["iptables", "-t", "nat", *args], capture_output=True, timeout=30)

    for rule in rules():
        if rule[:1] == ["-A"] and ours(rule):
            iptables("-D", *rule[1:])
    for _ in range(3):  # chains emptied by the first round may hold the only jumps to others
        current = rules()
        chains = {r[1] for r in current if r[:1] == ["-N"] and r[1].startswith("CNI-")}
        filled = {r[1] for r in current if r[:1] == ["-A"]}
        empty = {c for c in chains if c not in filled}
        if "CNI-HOSTPORT-DNAT" in empty:  # no port mapping left: the shared chains go too
            empty |= {c for c in chains if c.startswith("CNI-HOSTPORT-")}
        if not empty:
            return
        for rule in current:
            if rule[:1] == ["-A"] and "-j" in rule and rule[rule.index("-j") + 1] in empty:
                iptables("-D", *rule[1:])
        for chain in empty:
            iptables("-F", chain)
            iptables("-X", chain)


def _sysctl(key: str) -> str | None:
    try:
        return Path("/proc/sys", key).read_text().strip()
    except OSError:
        return None


def _set_sysctl(key: str, value: str) -> None:
    try:
        Path("/proc/sys", key).write_text(value)
    except OSError:
        pass
