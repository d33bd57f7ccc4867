"""Build the pinned upstream control plane and tools from source.

Every binary is built through the Go module proxy from the versions in ``pins.toml`` into a
cache outside the repository (``$REVERSI_CACHE`` or ``~/.cache/reversi``), one folder per
component and version, e.g. ``~/.cache/reversi/kubernetes-v1.36.3/bin/kube-apiserver``.
What is already built is skipped. Nothing built here is ever committed.

Why scratch modules: ``go install k8s.io/kubernetes/cmd/...@v1.36.3`` is refused because the
kubernetes module carries ``replace`` directives pointing at its in-tree ``staging/`` folder.
A scratch module that requires ``k8s.io/kubernetes`` and replaces each staging module
``k8s.io/<name>`` with its published ``v0.<minor>.<patch>`` release builds the same code.
etcd is built from a scratch module whose ``main`` calls ``etcdmain.Main(os.Args)``.

Requirements: Go (1.26+) and access to the Go module proxy. Users who bring a cluster of their
own need neither.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PINS_FILE = Path(__file__).with_name("pins.toml")


class BuildError(RuntimeError):
    """A component failed to build; the message names it and its build log."""


def load_pins() -> dict:
    """Return the parsed ``pins.toml`` (component name -> table); ``$REVERSI_PINS`` may name
    another pins file (used by tests to provoke a failing build)."""
    with Path(os.environ.get("REVERSI_PINS") or PINS_FILE).open("rb") as fh:
        return tomllib.load(fh)


def cache_root() -> Path:
    """The cache folder for built binaries: ``$REVERSI_CACHE`` or ``~/.cache/reversi``."""
    return Path(os.environ.get("REVERSI_CACHE") or Path.home() / ".cache" / "reversi")


@dataclass(frozen=True)
class Component:
    """One thing to build: its cache folder and the binaries it must produce."""

    name: str
    version: str
    binaries: tuple[str, ...]

    @property
    def root(self) -> Path:
        return cache_root() / f"{self.name}-{self.version}"

    @property
    def bindir(self) -> Path:
        return self.root / "bin"

    @property
    def log(self) -> Path:
        return self.root / "build.log"

    def path(self, binary: str) -> Path:
        return self.bindir / binary

    def is_built(self) -> bool:
        return all(os.access(self.path(b), os.X_OK) for b in self.binaries)


def components() -> dict[str, Component]:
    """The buildable components, keyed by name, with versions from ``pins.toml``."""
    pins = load_pins()
    return {
        "kubernetes": Component(
            "kubernetes", pins["kubernetes"]["version"], tuple(pins["kubernetes"]["commands"])
        ),
        # its folder names its main's hash: an edit of the main builds a new binary
        "controller-manager": Component("controller-manager", f"{pins['kubernetes']['version']}-{_main_hash()}",
                                        ("kube-controller-manager",)),
        "etcd": Component("etcd", pins["etcd"]["version"], ("etcd",)),
        "helm": Component("helm", pins["helm"]["version"], ("helm",)),
        "prometheus": Component("prometheus", pins["prometheus"]["version"], ("promtool", "prometheus")),
        "cli-utils": Component("cli-utils", pins["cli-utils"]["version"], ("kstatus-check",)),
        "node": Component("node", pins["kubernetes"]["version"], tuple(pins["node"]["commands"])),
        "containerd": Component("containerd", pins["containerd"]["version"],
                                ("containerd", "containerd-shim-runc-v2", "ctr")),
        "runc": Component("runc", pins["runc"]["version"], ("runc",)),
        "cni-plugins": Component("cni-plugins", pins["cni-plugins"]["version"],
                                 ("bridge", "host-local", "loopback", "portmap")),
        "cri-tools": Component("cri-tools", pins["cri-tools"]["version"], ("crictl",)),
        "coredns": Component("coredns", pins["coredns"]["version"], ("coredns",)),
    }

#: what the local control plane is built from (``reversi-devcluster build`` with no names)
CONTROL_PLANE_COMPONENTS = ("kubernetes", "controller-manager", "etcd")

#: what the real node needs besides the control plane (``reversi-devcluster up --real-node``)
NODE_COMPONENTS = ("node", "containerd", "runc", "cni-plugins", "cri-tools", "coredns")


def _main_hash() -> str:
    """Eight hex digits of :data:`CONTROLLER_MANAGER_MAIN`'s SHA-256."""
    return hashlib.sha256(CONTROLLER_MANAGER_MAIN.encode()).hexdigest()[:8]


def binary(component: str, name: str | None = None) -> Path:
    """Path of a built binary, e.g. ``binary("kubernetes", "kubectl")``; it may not exist yet."""
    comp = components()[component]
    return comp.path(name or comp.binaries[0])


def _go_env(workdir: Path, cgo: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-buildvcs=false")
    env["CGO_ENABLED"] = "1" if cgo else "0"
    env["GOWORK"] = "off"
    env["GOTOOLCHAIN"] = env.get("GOTOOLCHAIN", "local")
    return env


_STARTED = time.monotonic()
#: seconds between two progress lines of one long build step
PROGRESS_EVERY = 30.0


def progress(message: str) -> None:
    """Print a progress line on stderr, after the time since this process started
    (``  [ 2m05s] building kubernetes v1.36.3 ...``): the setup stages of ``up``, the demos and
    the builds say what they do while they take more than a few seconds."""
    took = int(time.monotonic() - _STARTED)
    print(f"  [{took // 60:2d}m{took % 60:02d}s] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def heartbeat(label: str | None) -> Iterator[None]:
    """While the body runs, a progress line every :data:`PROGRESS_EVERY` seconds
    (``<label>: still at work after 90s``); None: no lines."""
    done = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not done.wait(PROGRESS_EVERY):
            progress(f"{label}: still at work after {time.monotonic() - started:.0f}s")

    if label is not None:
        threading.Thread(target=beat, daemon=True, name=f"heartbeat {label}").start()
    try:
        yield
    finally:
        done.set()


def _run(cmd: list[str], cwd: Path, log: Path, label: str, progress_lines: bool = True, cgo: bool = False) -> None:
    """Run a go command, appending its output to ``log``; a progress line every
    :data:`PROGRESS_EVERY` seconds while it runs (:func:`heartbeat`)."""
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=_go_env(cwd, cgo), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        with heartbeat(label if progress_lines else None):  # also while go is silent (linking takes minutes)
            for line in proc.stdout:
                fh.write(line)
            rc = proc.wait()
    if rc != 0:
        raise BuildError(f"building {label} failed (exit {rc}); full log: {log}\n--- last lines ---\n{log_tail(log)}")


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of the log at ``path`` (empty when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _staging_replaces(k8s_version: str, staging_version: str, workdir: Path, log: Path) -> list[str]:
    """Read the staging module names from the kubernetes module's own go.mod replace lines."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{k8s_version}"],
        cwd=workdir, env=_go_env(workdir), capture_output=True, text=True,
    )
    if out.returncode != 0:
        log.write_text(out.stdout + out.stderr)
        raise BuildError(f"cannot download k8s.io/kubernetes@{k8s_version}; log: {log}")
    gomod = Path(json.loads(out.stdout)["GoMod"]).read_text()
    names = []
    for line in gomod.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("./staging/"):
            names.append(parts[0])
    if not names:
        raise BuildError(f"no staging replace lines found in k8s.io/kubernetes@{k8s_version} go.mod")
    return [f"replace {n} => {n} {staging_version}" for n in names]


#: The ``main`` of the local control plane's kube-controller-manager: upstream's own main
#: (cmd/kube-controller-manager/controller-manager.go) that first sets the Job controller's batching
#: of pod events (``SyncJobBatchPeriod``, exported by upstream for its tests, which set it to 100ms)
#: from ``REVERSI_JOB_SYNC_BATCH_PERIOD``. The Job controller, its syncs and the pods' life cycle are
#: upstream's; only how long it waits to gather pod events before a sync changes.
CONTROLLER_MANAGER_MAIN = """package main

import (
\t"fmt"
\t"os"
\t"time"
\t_ "time/tzdata"

\t"k8s.io/component-base/cli"
\t_ "k8s.io/component-base/logs/json/register"
\t_ "k8s.io/component-base/metrics/prometheus/clientgo"
\t_ "k8s.io/component-base/metrics/prometheus/version"
\t"k8s.io/kubernetes/cmd/kube-controller-manager/app"
\t"k8s.io/kubernetes/pkg/controller/job"
)

func main() {
\tif period := os.Getenv("REVERSI_JOB_SYNC_BATCH_PERIOD"); period != "" {
\t\td, err := time.ParseDuration(period)
\t\tif err != nil || d <= 0 {
\t\t\tfmt.Fprintf(os.Stderr, "REVERSI_JOB_SYNC_BATCH_PERIOD=%q: want a positive Go duration such as 100ms\\n", period)
\t\t\tos.Exit(2)
\t\t}
\t\tjob.SyncJobBatchPeriod = d
\t}
\tos.Exit(cli.Run(app.NewControllerManagerCommand()))
}
"""


def _build_kubernetes(comp: Component, pins: dict, main: str | None = None) -> None:
    """Commands of k8s.io/kubernetes (the control plane's, or the node's: ``comp.binaries``), or
    with ``main`` the one binary of ``comp`` from that Go source (:data:`CONTROLLER_MANAGER_MAIN`)."""
    k = pins["kubernetes"]
    src = comp.root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text("module reversi.local/k8sbuild\n\ngo 1.26.0\n")
    replaces = _staging_replaces(k["version"], k["staging_version"], src, comp.log)
    (src / "go.mod").write_text(
        "module reversi.local/k8sbuild\n\ngo 1.26.0\n\n"
        + "\n".join(replaces)
        + f"\n\nrequire k8s.io/kubernetes {k['version']}\n"
    )
    if main is None:
        pkgs = [f"k8s.io/kubernetes/cmd/{c}" for c in comp.binaries]
        _run(["go", "get", "-tool", *[f"{p}@{k['version']}" for p in pkgs]], src, comp.log,
             f"{comp.name} (resolve modules)")
        out = str(comp.bindir) + "/"
    else:
        (src / "main.go").write_text(main)
        _run(["go", "get", f"k8s.io/kubernetes@{k['version']}"], src, comp.log, f"{comp.name} (resolve modules)")
        _run(["go", "mod", "tidy"], src, comp.log, f"{comp.name} (tidy)")
        pkgs, out = ["."], str(comp.path(comp.binaries[0]))
    comp.bindir.mkdir(parents=True, exist_ok=True)
    _run(
        ["go", "build", "-v", "-trimpath", "-tags", ",".join(k["build_tags"]),
         "-ldflags", f"-s -w -X k8s.io/component-base/version.gitVersion={k['version']}"
         f" -X k8s.io/client-go/pkg/version.gitVersion={k['version']}",
         "-o", out, *pkgs],
        src, comp.log, f"{comp.name} {k['version']}",
    )


ETCD_MAIN = """package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


def _build_etcd(comp: Component, pins: dict) -> None:
    src = comp.root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text("module reversi.local/etcdbuild\n\ngo 1.26.0\n")
    (src / "main.go").write_text(ETCD_MAIN)
    _run(["go", "get", f"go.etcd.io/etcd/server/v3@{comp.version}"], src, comp.log,
         "etcd (resolve modules)")
    _run(["go", "mod", "tidy"], src, comp.log, "etcd (tidy)")
    comp.bindir.mkdir(parents=True, exist_ok=True)
    _run(["go", "build", "-v", "-trimpath", "-ldflags", "-s -w", "-o",
          str(comp.path("etcd")), "."], src, comp.log, f"etcd {comp.version}")


KSTATUS_MAIN = """// kstatus-check: the kstatus verdict of Kubernetes objects, computed by sigs.k8s.io/cli-utils.
//
// Reads one JSON object, or a list ({"items": [...]}), on stdin and prints one JSON line per
// object: {"kind", "namespace", "name", "status", "message"}, where status is what
// status.Compute says (InProgress, Current, Failed, Terminating, Unknown). Exit 1 on bad input.
package main

import (
\t"encoding/json"
\t"fmt"
\t"io"
\t"os"

\t"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
\t"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

func main() {
\tdata, err := io.ReadAll(os.Stdin)
\tif err != nil {
\t\tfail(err)
\t}
\tvar list struct {
\t\tItems []json.RawMessage `json:"items"`
\t}
\tif err := json.Unmarshal(data, &list); err != nil {
\t\tfail(err)
\t}
\titems := list.Items
\tif items == nil {
\t\titems = []json.RawMessage{data}
\t}
\tout := json.NewEncoder(os.Stdout)
\tfor _, raw := range items {
\t\tu := &unstructured.Unstructured{}
\t\tif err := u.UnmarshalJSON(raw); err != nil {
\t\t\tfail(err)
\t\t}
\t\tres, err := status.Compute(u)
\t\tif err != nil {
\t\t\tfail(fmt.Errorf("%s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err))
\t\t}
\t\t_ = out.Encode(map[string]string{"kind": u.GetKind(), "namespace": u.GetNamespace(), "name": u.GetName(),
\t\t\t"status": res.Status.String(), "message": res.Message})
\t}
}

func fail(err error) {
\tfmt.Fprintln(os.Stderr, "kstatus-check:", err)
\tos.Exit(1)
}
"""


def _build_kstatus(comp: Component) -> None:
    """The kstatus checker (:data:`KSTATUS_MAIN`) against the pinned sigs.k8s.io/cli-utils."""
    src = comp.root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text("module reversi.local/kstatuscheck\n\ngo 1.26.0\n")
    (src / "main.go").write_text(KSTATUS_MAIN)
    _run(["go", "get", f"sigs.k8s.io/cli-utils@{comp.version}"], src, comp.log, "cli-utils (resolve modules)")
    _run(["go", "mod", "tidy"], src, comp.log, "cli-utils (tidy)")
    comp.bindir.mkdir(parents=True, exist_ok=True)
    _run(["go", "build", "-v", "-trimpath", "-ldflags", "-s -w", "-o", str(comp.path("kstatus-check")), "."],
         src, comp.log, f"kstatus-check (cli-utils {comp.version})")


def coredns_main(plugins: list[str]) -> str:
    """The ``main`` of the CoreDNS build: CoreDNS's own ``coremain.Run`` with only ``plugins``
    (folders under github.com/coredns/coredns/plugin) registered; a Corefile that names another
    plugin is refused at start."""
    imports = "".join(f'\t_ "github.com/coredns/coredns/plugin/{name}"\n' for name in plugins)
    return (f"package main\n\nimport (\n\t\"github.com/coredns/coredns/coremain\"\n{imports})\n\n"
            "func main() { coremain.Run() }\n")


def _build_coredns(comp: Component, pins: dict) -> None:
    """CoreDNS from a scratch module (:func:`coredns_main`), static (``CGO_ENABLED=0``)."""
    src = comp.root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text("module reversi.local/corednsbuild\n\ngo 1.26.0\n")
    (src / "main.go").write_text(coredns_main(pins["coredns"]["plugins"]))
    _run(["go", "get", f"github.com/coredns/coredns@{comp.version}"], src, comp.log, "coredns (resolve modules)")
    _run(["go", "mod", "tidy"], src, comp.log, "coredns (tidy)")
    comp.bindir.mkdir(parents=True, exist_ok=True)
    _run(["go", "build", "-v", "-trimpath", "-ldflags", "-s -w", "-o", str(comp.path("coredns")), "."],
         src, comp.log, f"coredns {comp.version}")


def _build_tool(comp: Component, *packages: str) -> None:
    """Build commands of one module from a scratch module (``go install pkg@v`` refuses modules
    with ``replace`` or ``exclude`` directives, as Prometheus has)."""
    src = comp.root / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "go.mod").write_text(f"module reversi.local/{comp.name}build\n\ngo 1.26.0\n")
    _run(["go", "get", "-tool", *(f"{package}@{comp.version}" for package in packages)], src, comp.log,
         f"{comp.name} (resolve modules)")
    comp.bindir.mkdir(parents=True, exist_ok=True)
    _run(["go", "build", "-v", "-trimpath", "-ldflags", "-s -w", "-o", str(comp.bindir) + "/",
          *packages], src, comp.log, f"{comp.name} {comp.version}")


def _module_source(module: str, version: str, dest: Path, log: Path) -> Path:
    """A writable copy of ``module@version``'s source from the Go module proxy, in ``dest``
    (modules whose go.mod has ``replace`` or ``exclude`` directives build only from their own
    tree). Raises :class:`BuildError` when the module cannot be downloaded."""
    out = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], cwd=dest.parent,
                         env=_go_env(dest.parent), capture_output=True, text=True)
    if out.returncode != 0:
        log.write_text(out.stdout + out.stderr)
        raise BuildError(f"cannot download {module}@{version}; log: {log}")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(json.loads(out.stdout)["Dir"], dest)
    for path in (dest, *dest.rglob("*")):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)
    return dest


def _build_from_source(comp: Component, module: str, packages: list[str], tags: tuple[str, ...] = (),
                       cgo: bool = False) -> None:
    """Build ``packages`` (paths inside the module, ``.`` for its root) of ``module`` at the
    component's version from a copy of its source, into the component's bin folder."""
    comp.root.mkdir(parents=True, exist_ok=True)
    src = _module_source(module, comp.version, comp.root / "src", comp.log)
    comp.bindir.mkdir(parents=True, exist_ok=True)
    flags = ["-tags", ",".join(tags)] if tags else []
    target = str(comp.path(comp.binaries[0])) if packages == ["."] else str(comp.bindir) + "/"
    # -mod=mod: a module's zip has no vendor folder, though its go.mod may say to use one
    _run(["go", "build", "-mod=mod", "-v", "-trimpath", *flags, "-ldflags", "-s -w", "-o", target, *packages],
         src, comp.log, f"{comp.name} {comp.version}", cgo=cgo)


def _build_one(name: str, comp: Component, pins: dict) -> None:
    """Build component ``name`` (its recipe by name)."""
    if name == "kubernetes":
        _build_kubernetes(comp, pins)
    elif name == "controller-manager":
        _build_kubernetes(comp, pins, main=CONTROLLER_MANAGER_MAIN)
    elif name == "etcd":
        _build_etcd(comp, pins)
    elif name == "helm":
        _build_tool(comp, "helm.sh/helm/v3/cmd/helm")
    elif name == "prometheus":
        _build_tool(comp, "github.com/prometheus/prometheus/cmd/promtool",
                    "github.com/prometheus/prometheus/cmd/prometheus")
    elif name == "cli-utils":
        _build_kstatus(comp)
    elif name == "node":
        _build_kubernetes(comp, pins)
    elif name == "containerd":
        _build_from_source(comp, "github.com/containerd/containerd/v2",
                           ["./cmd/containerd", "./cmd/containerd-shim-runc-v2", "./cmd/ctr"],
                           tags=("no_btrfs", "no_devmapper", "no_zfs"))
    elif name == "runc":  # seccomp needs cgo and libseccomp (Debian: libseccomp-dev, pkg-config)
        _build_from_source(comp, "github.com/opencontainers/runc", ["."], tags=("seccomp",), cgo=True)
    elif name == "cni-plugins":
        _build_from_source(comp, "github.com/containernetworking/plugins",
                           ["./plugins/main/bridge", "./plugins/ipam/host-local", "./plugins/main/loopback",
                            "./plugins/meta/portmap"])
    elif name == "cri-tools":
        _build_from_source(comp, "sigs.k8s.io/cri-tools", ["./cmd/crictl"])
    elif name == "coredns":
        _build_coredns(comp, pins)


def build(names: list[str] | None = None, force: bool = False) -> dict[str, Component]:
    """Build the named components (default: the control plane's), skipping built ones.

    Returns the components by name. Raises :class:`BuildError` naming the component and its
    build log when a build fails.
    """
    pins = load_pins()
    comps = components()
    wanted = names or list(CONTROL_PLANE_COMPONENTS)
    for name in wanted:
        comp = comps[name]
        if comp.is_built() and not force:
            continue
        if shutil.which("go") is None:
            raise BuildError(
                "Go is needed to build the local control plane (see README: Requirements); "
                "install Go 1.26+ or point KUBECONFIG at a cluster of your own"
            )
        comp.root.mkdir(parents=True, exist_ok=True)
        comp.log.write_text("")
        started = time.monotonic()
        progress(f"building {name} {comp.version} into {comp.bindir} (first use only; log: {comp.log})")
        _build_one(name, comp, pins)
        missing = [b for b in comp.binaries if not comp.path(b).exists()]
        if missing:
            raise BuildError(f"building {name} produced no {', '.join(missing)}; log: {comp.log}")
        progress(f"built {name} {comp.version} in {time.monotonic() - started:.0f}s")
    return {n: comps[n] for n in wanted}
