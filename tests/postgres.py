"""A real PostgreSQL server for the archive's tests (never a mock): Debian's ``postgresql`` package
(``make node-deps`` installs it), initialised into a temporary folder and started on a free port
as the ``postgres`` user (it refuses to run as root), with a role ``reversi`` (password auth over
TCP) and a database ``reversi`` whose tables live in a tablespace on a small tmpfs, so a test can
fill its disk for real."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from reversi_devcluster.localop import free_port

PASSWORD = "archive-secret-7f3a"
DISK_BYTES = 8 * 1024 * 1024


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: run make node-deps (Debian's postgresql package)")
    return found[-1]


class Postgres:
    """One server: :meth:`start`, :meth:`stop`, :meth:`sql` as the superuser, :meth:`dsn`.
    ``folder`` (default: a new one under /tmp, which the ``postgres`` user can reach);
    ``disk_bytes``: the size of the tmpfs its database lives on (a tmpfs takes memory only for
    what it holds)."""

    def __init__(self, folder: Path | None = None, disk_bytes: int = DISK_BYTES):
        self.folder = folder or Path(tempfile.mkdtemp(prefix="reversi-pg-"))
        self.disk_bytes = disk_bytes
        self.data = self.folder / "data"
        self.disk = self.folder / "disk"
        self.port = free_port()
        self.log = self.folder / "postgres.log"

    def _as_postgres(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], check=check, capture_output=True, text=True,
                              timeout=120)

    def init(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.disk.mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.disk_bytes}", "tmpfs", str(self.disk)], check=True)
        (self.disk / "ts").mkdir()
        shutil.chown(self.folder, "postgres")
        shutil.chown(self.disk / "ts", "postgres")
        os.chmod(self.folder, 0o700)
        self._as_postgres(_bin("initdb"), "-D", str(self.data), "-A", "scram-sha-256", "--username=postgres",
                          f"--pwfile={self._pwfile()}", "-E", "UTF8")
        self.start()
        self.sql(f"CREATE ROLE reversi LOGIN PASSWORD '{PASSWORD}'")
        self.sql(f"CREATE TABLESPACE tiny OWNER reversi LOCATION '{self.disk / 'ts'}'")
        self.sql("CREATE DATABASE reversi OWNER reversi TABLESPACE tiny")

    def _pwfile(self) -> str:
        path = self.folder / "pw"
        path.write_text(PASSWORD + "\n")
        shutil.chown(path, "postgres")
        return str(path)

    def start(self) -> None:
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o",
                          f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1", "start")

    def stop(self) -> None:
        self._as_postgres(_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def destroy(self) -> None:
        self.stop()
        subprocess.run(["umount", str(self.disk)], check=False)
        shutil.rmtree(self.folder, ignore_errors=True)

    def dsn(self, password: str = PASSWORD, database: str = "reversi", user: str = "reversi") -> str:
        return f"host=127.0.0.1 port={self.port} dbname={database} user={user} password={password}"

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run ``statement`` as the superuser; its output (unaligned, no headers)."""
        env = {**os.environ, "PGPASSWORD": PASSWORD}
        out = subprocess.run([_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", database,
                              "-v", "ON_ERROR_STOP=1", "-At", "-c", statement], check=True, capture_output=True,
                             text=True, env=env, timeout=60)
        return out.stdout.strip()
