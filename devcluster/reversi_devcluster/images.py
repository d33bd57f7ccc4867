"""Container images for the real node, built on this machine with no registry.

- **Python base** (``localhost/reversi-python-base:<suite>``): Debian ``<suite>`` from its packages
  (``debootstrap --variant=minbase`` with python3, pip and the CA certificates), trusting what this
  machine trusts (its CA bundle is copied in, so a build behind a TLS-inspecting proxy can reach
  the package index). It stands in for ``python:3.11-slim``, which no registry here serves; the
  Dockerfile takes it as its ``PYTHON_IMAGE`` build argument and is otherwise unchanged.
- **pause** (``registry.k8s.io/pause:<version>``): the pod sandbox, Kubernetes' own ``pause.c``
  from the pinned k8s.io/kubernetes module, compiled static.
- **CoreDNS** (``localhost/coredns:<version>``): the cluster DNS of the real node, its static
  binary built from the pinned module (``build.py``) alone in an image.
- **The project's images** (``localhost/reversi-operator:dev``, ``localhost/reversi-demo:dev``): the
  Dockerfile's ``operator`` and ``demo`` targets, built by buildah (``bud --layers``, chroot
  isolation) from this checkout.

Everything lives in buildah's storage under ``<cache>/images`` (never the system's), and is
rebuilt only when its inputs change (buildah's layer cache for the Dockerfile). :func:`load`
copies images into a containerd's ``k8s.io`` namespace, skipping those already there.

Requirements (Debian packages): buildah, debootstrap, gcc. Every failure raises
:class:`ImageError` naming the step and its log.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import build

#: the Debian release of the Python base (bookworm ships Python 3.11, the project's version)
SUITE = "bookworm"
#: packages of the base on top of minbase (python3-minimal alone lacks json and http)
BASE_PACKAGES = ("python3", "python3-pip", "ca-certificates")
BASE_IMAGE = f"localhost/reversi-python-base:{SUITE}"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
OPERATOR_IMAGE = "localhost/reversi-operator:dev"
DEMO_IMAGE = "localhost/reversi-demo:dev"
#: the Dockerfile's targets and the tag each is built as
PROJECT_IMAGES = {"operator": OPERATOR_IMAGE, "demo": DEMO_IMAGE}
#: the host's extra CA certificates, copied into the base with its CA bundle
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class ImageError(RuntimeError):
    """An image could not be built or loaded; the message names the step and its log."""


@dataclass(frozen=True)
class Store:
    """buildah with its storage under ``root`` (default ``<cache>/images``)."""

    root: Path

    @classmethod
    def default(cls) -> Store:
        return cls(build.cache_root() / "images")

    @property
    def log(self) -> Path:
        return self.root / "build.log"

    def buildah(self, *args: str, check: bool = True, capture: bool = True, timeout: float = 1800) -> str:
        """Run ``buildah <args>`` on this store; its output (stdout) is returned, its stderr
        appended to :attr:`log`. Raises :class:`ImageError` when it fails and ``check``."""
        if shutil.which("buildah") is None:
            raise ImageError("buildah is needed to build the real node's images (Debian: apt-get install buildah)")
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = ["buildah", "--root", str(self.root / "storage"), "--runroot", str(self.root / "run"),
               "--storage-driver", "overlay", *args]
        with self.log.open("a") as log:
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.run(cmd, stdout=subprocess.PIPE if capture else log, stderr=log, text=True,
                                  timeout=timeout)
        if check and proc.returncode != 0:
            raise ImageError(f"buildah {args[0]} failed (exit {proc.returncode}); log: {self.log}\n"
                             f"{build.log_tail(self.log)}")
        return proc.stdout or ""

    def image_id(self, ref: str) -> str | None:
        """The ID of image ``ref`` in this store, or None when it has none."""
        out = self.buildah("images", "--json", ref, check=False)
        try:
            found = json.loads(out or "[]")
        except json.JSONDecodeError:
            return None
        return found[0]["id"] if found else None


def python_base(store: Store) -> str:
    """Build the Python base (see the module docstring) unless it exists; return its ref.
    Raises :class:`ImageError`."""
    digest = hashlib.sha256(" ".join((SUITE, *BASE_PACKAGES)).encode()).hexdigest()[:12]
    ref = f"{BASE_IMAGE}-{digest}"
    if store.image_id(ref):
        store.buildah("tag", ref, BASE_IMAGE)
        return BASE_IMAGE
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is needed to build the Python base image (Debian: apt-get install debootstrap)")
    started = time.monotonic()
    build.progress(f"building the image base {BASE_IMAGE} from Debian {SUITE}'s packages (first use only; "
                   f"log: {store.log})")
    with tempfile.TemporaryDirectory(dir=store.root, prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        with store.log.open("a") as log:
            log.write(f"\n$ debootstrap {SUITE} ({', '.join(BASE_PACKAGES)})\n")
            log.flush()
            with build.heartbeat(f"debootstrap of {SUITE}"):
                proc = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
                                       SUITE, str(rootfs), "http://deb.debian.org/debian"],
                                      stdout=log, stderr=log, timeout=1800)
        if proc.returncode != 0:
            raise ImageError(f"debootstrap of {SUITE} failed (exit {proc.returncode}); log: {store.log}\n"
                             f"{build.log_tail(store.log)}")
        _finish_rootfs(rootfs)
        container = store.buildah("from", "scratch").strip()
        try:
            mount = Path(store.buildah("mount", container).strip())
            subprocess.run(["cp", "-a", f"{rootfs}/.", f"{mount}/"], check=True)
            store.buildah("umount", container)
            store.buildah("config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                          "--env", "LANG=C.UTF-8", "--cmd", '["python3"]', container)
            store.buildah("commit", "-q", container, ref)
        finally:
            store.buildah("rm", container, check=False)
    store.buildah("tag", ref, BASE_IMAGE)
    build.progress(f"built {BASE_IMAGE} in {time.monotonic() - started:.0f}s")
    return BASE_IMAGE


def _finish_rootfs(rootfs: Path) -> None:
    """What ``python:3.11-slim`` offers that the Dockerfile uses: ``python`` and a ``pip`` that
    installs into the image (the base is the image's own interpreter, not Debian's system one);
    this machine's CA certificates; no package lists or docs."""
    (rootfs / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink(missing_ok=True)
    python = rootfs / "usr/bin/python"
    if not python.exists():
        python.symlink_to("python3")
    if HOST_CA_DIR.is_dir():
        for cert in HOST_CA_DIR.glob("*.crt"):
            shutil.copy2(cert, rootfs / "usr/local/share/ca-certificates" / cert.name)
    if HOST_CA_BUNDLE.is_file():
        shutil.copy2(HOST_CA_BUNDLE, rootfs / "etc/ssl/certs/ca-certificates.crt")
    for junk in ("var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man", "usr/share/locale"):
        shutil.rmtree(rootfs / junk, ignore_errors=True)


def pause(store: Store) -> str:
    """Build the pause image from Kubernetes' ``pause.c`` (pinned module) unless it exists;
    return its ref. Raises :class:`ImageError` (no gcc, no module source)."""
    if store.image_id(PAUSE_IMAGE):
        return PAUSE_IMAGE
    if shutil.which("gcc") is None:
        raise ImageError("gcc is needed to build the pause image (Debian: apt-get install gcc)")
    version = build.load_pins()["kubernetes"]["version"]
    out = subprocess.run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"], cwd=store.root,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise ImageError(f"cannot download k8s.io/kubernetes@{version} for pause.c: {out.stderr[-500:]}")
    source = Path(json.loads(out.stdout)["Dir"]) / "build/pause/linux/pause.c"
    with tempfile.TemporaryDirectory(dir=store.root) as tmp:
        binary = Path(tmp) / "pause"
        proc = subprocess.run(["gcc", "-Os", "-static", "-Wall", "-o", str(binary), str(source)],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise ImageError(f"compiling {source} failed: {proc.stderr[-800:]}")
        container = store.buildah("from", "scratch").strip()
        try:
            store.buildah("copy", "--chmod", "0755", container, str(binary), "/pause")
            store.buildah("config", "--entrypoint", '["/pause"]', "--user", "65535:65535", container)
            store.buildah("commit", "-q", container, PAUSE_IMAGE)
        finally:
            store.buildah("rm", container, check=False)
    return PAUSE_IMAGE


def coredns_image() -> str:
    """The ref of the CoreDNS image of the pinned version (``localhost/coredns:<version>``)."""
    return f"localhost/coredns:{build.load_pins()['coredns']['version']}"


def coredns(store: Store) -> str:
    """Build the CoreDNS image (the static binary built from the pinned version, alone in an
    image: ``/coredns`` as its entrypoint) unless it exists; return its ref. Raises
    :class:`ImageError` (and ``BuildError`` when the binary cannot be built)."""
    ref = coredns_image()
    if store.image_id(ref):
        return ref
    binary = build.build(["coredns"])["coredns"].path("coredns")
    container = store.buildah("from", "scratch").strip()
    try:
        store.buildah("copy", "--chmod", "0755", container, str(binary), "/coredns")
        store.buildah("config", "--entrypoint", '["/coredns"]', "--port", "53/udp", "--port", "53/tcp", container)
        store.buildah("commit", "-q", container, ref)
    finally:
        store.buildah("rm", container, check=False)
    return ref


def checkout_root() -> Path:
    """The checkout whose Dockerfile builds the project's images. Raises :class:`ImageError`
    when the package does not run from a checkout (an installed wheel carries no Dockerfile)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "Dockerfile").is_file():
        raise ImageError(f"no Dockerfile in {root}: the project's images are built from a checkout of Reversi")
    return root


def build_context(root: Path, dest: Path) -> str:
    """Copy into ``dest`` what the Dockerfile of checkout ``root`` may see, by its .dockerignore
    (an allow-list: ``*``, then ``!path`` for each file or folder let in, then patterns such as
    ``**/__pycache__`` left out again), and return the SHA-256 of that context with the Dockerfile.

    Why a copy: buildah 1.28 (Debian's) computes the cache key of a ``COPY`` from the context
    without the .dockerignore's exceptions, so a changed file under an allowed folder kept the old
    layer; in a context that needs no ignore file its cache follows the content."""
    lines = [line.strip() for line in (root / ".dockerignore").read_text().splitlines()]
    allowed = [line[1:].strip("/") for line in lines if line.startswith("!")]
    dropped = [line.removeprefix("**/") for line in lines if line and not line.startswith(("#", "!")) and line != "*"]
    digest = hashlib.sha256((root / "Dockerfile").read_bytes())
    for entry in sorted(allowed):
        source = root / entry
        files = sorted(p for p in source.rglob("*") if p.is_file()) if source.is_dir() else [source]
        for path in files:
            rel = path.relative_to(root)
            if not path.exists() or any(fnmatch.fnmatch(part, pattern) for part in rel.parts for pattern in dropped):
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest / rel)
            digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def project(store: Store, targets: tuple[str, ...] = ("operator", "demo")) -> list[str]:
    """Build the Dockerfile's ``targets`` from this checkout on the Python base unless the
    image of the same context (:func:`build_context`) and base is there; return their refs.
    Raises :class:`ImageError`."""
    base = python_base(store)
    root = checkout_root()
    record = store.root / "built.json"
    built = json.loads(record.read_text()) if record.exists() else {}
    refs = []
    with tempfile.TemporaryDirectory(dir=store.root, prefix="context-") as tmp:
        digest = hashlib.sha256((build_context(root, Path(tmp)) + (store.image_id(base) or "")).encode()).hexdigest()
        for target in targets:
            ref = PROJECT_IMAGES[target]
            if built.get(ref) != digest or store.image_id(ref) is None:
                started = time.monotonic()
                build.progress(f"building the image {ref} from this checkout's Dockerfile (target {target}; "
                               f"log: {store.log})")
                # SOURCE_DIGEST: the Dockerfile's runtime stage declares it, so the step that installs
                # the build stage's wheels (a bind mount buildah's cache does not follow) runs again
                with build.heartbeat(f"the image {ref}"):
                    store.buildah("bud", "--layers", "--pull=never", "--isolation", "chroot", "--build-arg",
                                  f"PYTHON_IMAGE={base}", "--build-arg", f"SOURCE_DIGEST={digest}", "--target",
                                  target, "-t", ref, "-f", str(root / "Dockerfile"), tmp, capture=False)
                built[ref] = digest
                record.write_text(json.dumps(built))
                build.progress(f"built {ref} in {time.monotonic() - started:.0f}s")
            refs.append(ref)
    return refs


def load(store: Store, refs: list[str], ctr: Path, address: Path, record: Path) -> list[str]:
    """Copy images ``refs`` from the store into the containerd at socket ``address`` (its
    ``k8s.io`` namespace, where the kubelet looks) with the binary ``ctr``, skipping an image
    whose ID ``record`` (a JSON file of ref -> ID) says is already there. Returns the refs copied.
    Raises :class:`ImageError`."""
    done = json.loads(record.read_text()) if record.exists() else {}
    present = subprocess.run([str(ctr), "--address", str(address), "-n", "k8s.io", "images", "ls", "-q"],
                             capture_output=True, text=True, timeout=60).stdout.split()
    copied = []
    for ref in refs:
        image_id = store.image_id(ref)
        if image_id is None:
            raise ImageError(f"no image {ref} in {store.root}: build it first")
        if done.get(ref) == image_id and ref in present:
            continue
        with tempfile.TemporaryDirectory(dir=store.root) as tmp:
            archive = Path(tmp) / "image.tar"
            store.buildah("push", "-q", ref, f"docker-archive:{archive}:{ref}")
            proc = subprocess.run([str(ctr), "--address", str(address), "-n", "k8s.io", "images", "import",
                                   str(archive)], capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                raise ImageError(f"importing {ref} into containerd failed: {proc.stderr[-800:]}")
        done[ref] = image_id
        copied.append(ref)
    record.write_text(json.dumps(done))
    return copied
