"""The Debian packages the real node needs, and their install: the one list of them.

``make node-deps``, ``.ci/run`` and the demos (``make demo``, ``make demo-mcp``) install them through
this module, so the list cannot drift apart. It uses only the standard library: ``make node-deps``
runs it as a script before the package is installed (``python3 devcluster/reversi_devcluster/nodedeps.py``).
Run as a script it also installs :data:`TEST_PACKAGES` (PostgreSQL, for the archive's tests).

    python3 devcluster/reversi_devcluster/nodedeps.py           # install the missing ones (root, apt-get)
    python3 devcluster/reversi_devcluster/nodedeps.py --check   # exit 1 and name them when some are missing
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

#: each Debian package the real node needs, with the command it brings (None: a build library) and why
PACKAGES: dict[str, tuple[str | None, str]] = {
    "iptables": ("iptables", "kube-proxy's Services and the pod network's rules"),
    "iproute2": ("ip", "the pod bridge"),
    "libseccomp-dev": (None, "runc's build (seccomp)"),
    "pkg-config": ("pkg-config", "runc's build"),
    "gcc": ("gcc", "runc's build (cgo) and the pause image"),
    "buildah": ("buildah", "the images, built here from the Dockerfile"),
    "debootstrap": ("debootstrap", "the images' Python base, from Debian's packages"),
}

#: packages the tests need besides the node's (``make node-deps`` installs them too; the demos do not)
TEST_PACKAGES: dict[str, tuple[str | None, str]] = {
    "postgresql": ("pg_ctlcluster", "the real server the archive's tests start (tests/postgres.py)"),
}


def missing(packages: dict[str, tuple[str | None, str]] | None = None) -> list[str]:
    """The packages of ``packages`` (default :data:`PACKAGES`) not installed here: by dpkg where
    there is one, else by the command each brings (a library without a command is then taken as
    present)."""
    wanted = PACKAGES if packages is None else packages
    if shutil.which("dpkg-query"):
        out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", *wanted],
                             capture_output=True, text=True, timeout=60).stdout
        installed = {line.split()[0] for line in out.splitlines() if line.endswith(" installed")}
        return [name for name in wanted if name not in installed]
    return [name for name, (command, _) in wanted.items() if command and shutil.which(command) is None]


def install_command(names: list[str]) -> str:
    """The shell line that installs ``names`` (what to run by hand)."""
    return f"apt-get update && apt-get install -y --no-install-recommends {' '.join(names)}"


def cannot_install() -> str | None:
    """Why this process cannot install packages itself (one line), or None when it can (root, apt-get)."""
    if os.geteuid() != 0:
        return "installing them needs root"
    if shutil.which("apt-get") is None:
        return "this machine has no apt-get"
    return None


def install(names: list[str]) -> None:
    """``apt-get update`` then ``apt-get install`` of ``names`` (quietly, no recommends). Raises
    ``RuntimeError`` with apt's last lines when either fails."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"],
                ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *names]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            raise RuntimeError(f"{' '.join(cmd[:2])} failed (exit {proc.returncode}):\n{tail}")


def main(argv: list[str]) -> int:
    names = missing({**PACKAGES, **TEST_PACKAGES})
    if not names:
        return 0
    if "--check" in argv:
        print(f"missing: {' '.join(names)} (install: {install_command(names)})")
        return 1
    why = cannot_install()
    if why:
        print(f"the real node needs {' '.join(names)}, and {why}: {install_command(names)}", file=sys.stderr)
        return 1
    print(f"installing {' '.join(names)}", flush=True)
    try:
        install(names)
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
