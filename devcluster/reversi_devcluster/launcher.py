"""Start one container's process inside a private mount namespace.

The node agent runs ``unshare --mount --propagation private -- python -m
reversi_devcluster.launcher SPEC.json``. This module bind-mounts each prepared volume folder
(and the container's termination-message file) at its ``mountPath``, changes to the working
directory and replaces itself with the container's command (``execvpe``), so the command's
exit code is the container's exit code. The mounts vanish with the namespace when the
process ends.

SPEC.json: ``{"argv": [...], "env": {...}, "workingDir": str|null,
"mounts": [{"source": path, "target": path, "readOnly": bool}], "expose": [path, ...]}``.

``expose`` lists host paths the process needs (its program, script, working folder, the agent's
PYTHONPATH) that a volume could hide — say an emptyDir at ``/tmp`` when the checkout lives under
``/tmp``: the image is ignored, so the host file system is the container's. Each one that a mount
hid is bound back at its own path inside the mounted volume.

Mount targets that do not exist are created on the host file system (as empty folders or
files) before mounting; only what is mounted over them is private to the pod.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384


def _mount(source: str, target: str, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def bind(source: str, target: str, read_only: bool, is_dir: bool | None = None) -> None:
    """Bind-mount ``source`` at ``target`` (creating the target), read-only if asked."""
    if is_dir if is_dir is not None else os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
        if not os.path.exists(target):
            open(target, "a").close()
    _mount(source, target, MS_BIND | MS_REC)
    if read_only:
        _mount(source, target, MS_BIND | MS_REMOUNT | MS_RDONLY)


def main(argv: list[str]) -> int:
    with open(argv[1]) as fh:
        spec = json.load(fh)
    try:
        # Open every source before mounting anything: a volume mounted at /tmp must not hide a
        # later source that lives under /tmp. Mounting from /proc/self/fd/N uses the open file.
        mounts = spec.get("mounts", [])
        fds = [os.open(m["source"], os.O_PATH) for m in mounts]
        dirs = [os.path.isdir(m["source"]) for m in mounts]
        exposed = [(p, os.open(p, os.O_PATH), os.path.isdir(p)) for p in spec.get("expose", []) if os.path.exists(p)]
        for m, fd, is_dir in zip(mounts, fds, dirs, strict=True):
            bind(f"/proc/self/fd/{fd}", m["target"], bool(m.get("readOnly")), is_dir=is_dir)
        for path, fd, is_dir in exposed:
            if not os.path.exists(path):  # hidden by a volume: bind the host's copy back
                bind(f"/proc/self/fd/{fd}", path, False, is_dir=is_dir)
        for fd in fds + [fd for _, fd, _ in exposed]:
            os.close(fd)
        if spec.get("workingDir"):
            os.makedirs(spec["workingDir"], exist_ok=True)
            os.chdir(spec["workingDir"])
    except OSError as err:
        print(f"reversi node agent: cannot set up container: {err}", file=sys.stderr)
        return 128
    argv_ = spec["argv"]
    try:
        os.execvpe(argv_[0], argv_, spec["env"])
    except OSError as err:
        print(f"reversi node agent: cannot start {argv_[0]!r}: {err}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
