"""The archive of deleted Runs in PostgreSQL (docs/operations.md#the-archive), with psycopg 3.

- :meth:`Archive.migrate` applies the versioned migrations in ``archive_sql/`` (``NNNN_*.sql``)
  that the database has not seen, each in one transaction under an advisory lock (two operator
  replicas starting at once apply each once), recorded in ``reversi_archive_schema``.
- :meth:`Archive.write` writes one Run's record (:class:`reversi.engine.archive.Record`) in one
  transaction keyed by the Run's uid: the run's row is inserted or replaced (``ON CONFLICT (uid)
  DO UPDATE``, ``writes`` counting the writes) and its steps, requests and actions replaced, so a
  retry (the operator crashed between the commit and the Run's delete) never writes the Run
  twice. It returns only after the commit: the caller deletes the Run after that.
- :meth:`Archive.runs` and :meth:`Archive.record` read it back (``kubectl reversi archive``).

Every failure raises :class:`ArchiveError` with a ``kind`` (``unreachable``, ``auth``,
``disk_full``, ``schema``, ``other``) and a message that never carries the connection string
(:func:`redact`). Connections time out: ``connect_timeout`` seconds to connect, and a statement
may take ``statement_timeout`` seconds.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..engine.archive import Record, request_columns, step_columns

#: the advisory lock migrations take (any constant both replicas agree on)
MIGRATION_LOCK = 0x72657673  # "revs"
CONNECT_TIMEOUT = 5
STATEMENT_TIMEOUT_SECONDS = 30


class ArchiveError(Exception):
    """The archive could not be read or written: ``kind`` (``unreachable``, ``auth``,
    ``disk_full``, ``schema``, ``other``) and a message without the connection string."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def redact(text: str, dsn: str) -> str:
    """``text`` without the connection string or its password (``password=...``, the password
    of a ``postgresql://user:password@host`` URL)."""
    out = text.replace(dsn, "<dsn>") if dsn else text
    for secret in re.findall(r"password\s*=\s*'?([^'\s]+)", dsn) + re.findall(r"://[^:/@]+:([^@/]+)@", dsn):
        out = out.replace(secret, "<password>")
    return out


def _kind(err: BaseException) -> str:
    import psycopg

    sqlstate = getattr(err, "sqlstate", None) or ""
    if sqlstate.startswith("28") or "password authentication failed" in str(err):
        return "auth"
    if sqlstate == "53100" or "No space left on device" in str(err):
        return "disk_full"
    if sqlstate.startswith("42"):
        return "schema"
    if isinstance(err, psycopg.OperationalError):
        return "unreachable"
    return "other"


def migrations() -> list[tuple[int, str, str]]:
    """``(version, file name, SQL)`` of every migration in ``archive_sql/``, in order."""
    folder = resources.files(__package__ or "reversi.adapters").joinpath("archive_sql")
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d{4})_.*\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found)


@dataclass(frozen=True)
class ArchivedRun:
    """One archived Run as ``archive list`` shows it."""

    uid: str
    namespace: str
    name: str
    principal: str | None
    actor: str | None
    created_at: dt.datetime | None
    last_activity: dt.datetime | None
    archived_at: dt.datetime
    steps: int
    deleted_reason: str
    writes: int


class Archive:
    """The archive in the PostgreSQL database ``dsn`` (a libpq connection string or URL; empty:
    libpq's environment, ``PGHOST`` and the rest). One connection, opened on first use and
    opened again after a failure; safe from several threads (writes take turns)."""

    def __init__(self, dsn: str, *, connect_timeout: int = CONNECT_TIMEOUT,
                 statement_timeout: float = STATEMENT_TIMEOUT_SECONDS):
        self.dsn = dsn
        self.connect_timeout = connect_timeout
        self.statement_timeout = statement_timeout
        self._conn: Any = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------------ connection

    def _connect(self) -> Any:
        import psycopg

        if self._conn is not None and not self._conn.closed:
            return self._conn
        self._conn = psycopg.connect(self.dsn, connect_timeout=self.connect_timeout, autocommit=True,
                                     options=f"-c statement_timeout={int(self.statement_timeout * 1000)}",
                                     application_name="reversi")
        return self._conn

    def _attempt(self, work: Any, what: str) -> Any:
        """``work(connection)`` on the open connection; when that connection turns out broken (the
        server restarted or ended it since its last use), once more on a new one. Raises
        :class:`ArchiveError`. Call with the lock held."""
        import psycopg

        reused = self._conn is not None and not self._conn.closed
        try:
            return work(self._connect())
        except psycopg.OperationalError as err:
            if not reused:
                raise self._fail(err, what) from err
            self._fail(err, what)  # drop the broken connection
        except psycopg.Error as err:
            raise self._fail(err, what) from err
        try:
            return work(self._connect())
        except psycopg.Error as err:
            raise self._fail(err, what) from err

    def _fail(self, err: BaseException, what: str) -> ArchiveError:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001 - it is being dropped anyway
                pass
            self._conn = None
        return ArchiveError(_kind(err), redact(f"{what}: {err}".strip(), self.dsn))

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # ------------------------------------------------------------------------------ schema

    def migrate(self) -> list[int]:
        """Apply the migrations the database has not seen; the versions applied now. Raises
        :class:`ArchiveError`."""

        def work(conn: Any) -> list[int]:
            applied: list[int] = []
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                conn.execute("CREATE TABLE IF NOT EXISTS reversi_archive_schema (version integer PRIMARY KEY, "
                             "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
                done = {row[0] for row in conn.execute("SELECT version FROM reversi_archive_schema")}
                for version, name, sql in migrations():
                    if version in done:
                        continue
                    conn.execute(sql.encode())  # a migration file of the package, never user input
                    conn.execute("INSERT INTO reversi_archive_schema (version, name) VALUES (%s, %s)",
                                 (version, name))
                    applied.append(version)
            return applied

        with self._lock:
            found: list[int] = self._attempt(work, "the archive's schema could not be applied")
        return found

    # ------------------------------------------------------------------------------ writing

    def write(self, record: Record) -> int:
        """Write ``record`` in one transaction keyed by the Run's uid (module docstring); returns
        how often this Run has been written (1 the first time). Returns after the commit; raises
        :class:`ArchiveError` when nothing was committed."""
        from psycopg.types.json import Jsonb

        cols = record.columns()
        uid = cols["uid"]

        def work(conn: Any) -> Any:
            with conn.transaction():
                names = ", ".join([*cols, "run"])
                marks = ", ".join(["%s"] * (len(cols) + 1))
                updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in [*cols, "run"] if c != "uid")
                row = conn.execute((
                    f"INSERT INTO reversi_runs ({names}) VALUES ({marks}) ON CONFLICT (uid) DO UPDATE SET "
                    f"{updates}, archived_at = now(), writes = reversi_runs.writes + 1 RETURNING writes").encode(),
                    [*cols.values(), Jsonb(dict(record.run))]).fetchone()
                for table in ("reversi_steps", "reversi_requests", "reversi_actions"):
                    conn.execute(f"DELETE FROM {table} WHERE run_uid = %s".encode(), (uid,))
                self._children(conn, uid, record)
            return row

        with self._lock:
            row = self._attempt(work, f"Run {record.namespace}/{record.name} was not archived")
        return int(row[0]) if row else 1

    @staticmethod
    def _children(conn: Any, uid: str, record: Record) -> None:
        from psycopg.types.json import Jsonb

        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO reversi_steps (run_uid, index, tool, outcome, principal, recorded_at, step) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [(uid, c["index"], c["tool"], c["outcome"], c["principal"], c["recorded_at"], Jsonb(dict(s)))
                 for s in record.steps for c in [step_columns(s)]])
            cur.executemany(
                "INSERT INTO reversi_requests (run_uid, uid, name, phase, created_at, completed_at, request) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [(uid, c["uid"], c["name"], c["phase"], c["created_at"], c["completed_at"], Jsonb(dict(r)))
                 for r in record.requests for c in [request_columns(r)]])
            cur.executemany(
                "INSERT INTO reversi_actions (run_uid, seq, at, actor, action, step, request, note) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                [(uid, i, a.at, a.actor, a.action, a.step, a.request, a.note) for i, a in enumerate(record.actions)])

    # ------------------------------------------------------------------------------ reading

    def runs(self, *, namespace: str | None = None, name: str | None = None, principal: str | None = None,
             tool: str | None = None, since: dt.datetime | None = None, until: dt.datetime | None = None,
             limit: int = 100) -> list[ArchivedRun]:
        """Archived Runs matching every filter given, newest first (by creation), at most
        ``limit``. ``since``/``until`` bound the run's creation time; ``tool``: runs with a step
        of that tool. Raises :class:`ArchiveError`."""
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("r.namespace", namespace), ("r.name", name), ("r.principal", principal)):
            if value is not None:
                where.append(f"{column} = %s")
                args.append(value)
        if tool is not None:
            where.append("EXISTS (SELECT 1 FROM reversi_steps s WHERE s.run_uid = r.uid AND s.tool = %s)")
            args.append(tool)
        if since is not None:
            where.append("r.created_at >= %s")
            args.append(since)
        if until is not None:
            where.append("r.created_at < %s")
            args.append(until)
        sql = ("SELECT uid::text, namespace, name, principal, actor, created_at, last_activity, archived_at, steps, "
               "deleted_reason, writes FROM reversi_runs r" + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY created_at DESC NULLS LAST, name LIMIT %s")
        return [ArchivedRun(*row) for row in self._read(sql, [*args, limit])]

    def record(self, uid: str) -> Record | None:
        """The archived record of the Run with ``uid``, or None. Raises :class:`ArchiveError`."""
        rows = self._read("SELECT run, deleted_reason, last_activity FROM reversi_runs WHERE uid = %s", [uid])
        if not rows:
            return None
        run, reason, last = rows[0]
        steps = [row[0] for row in self._read("SELECT step FROM reversi_steps WHERE run_uid = %s ORDER BY index",
                                              [uid])]
        requests = [row[0] for row in self._read(
            "SELECT request FROM reversi_requests WHERE run_uid = %s ORDER BY created_at, name", [uid])]
        from ..engine.archive import record as build

        return build(run, steps, requests, reason, last)

    def counts(self) -> dict[str, int]:
        """Rows per table (the bench's check that nothing is written twice)."""
        out = {}
        for table in ("reversi_runs", "reversi_steps", "reversi_requests", "reversi_actions"):
            out[table] = int(self._read(f"SELECT count(*) FROM {table}", [])[0][0])
        return out

    def _read(self, sql: str, args: list[Any]) -> list[tuple]:

        with self._lock:
            found: list[tuple] = self._attempt(lambda conn: list(conn.execute(sql.encode(), args).fetchall()),
                                               "the archive could not be read")
        return found
