"""``PgStore``: a ``postgresql://`` WAL location as a :class:`~agent_saga.wal.store.LogStore`.

Reads use one autocommit connection per thread (per process: a forked child opens
its own), each query a complete statement, so nothing is held open between the
pages of a scan. ``docs/log-format.md`` §11.3 and ``docs/postgres.md`` describe it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ..path_check import NoWAL
from ..reader import Damage, Decryptor, Record, VerifyReport
from ..records import TAIL_REPAIRED
from ._exclusive import PgLeaseTable, db_now
from ._location import PgLocation, PgWALError, parse_location, psycopg_module
from ._rows import read_log_row, scan_log
from ._schema import SCHEMA_VERSION, MigrateReport, SchemaMissing, migrate, schema_version, sql
from ._writer import PgWriter, open_pg_writer

if TYPE_CHECKING:
    from ..compaction import CompactionReport
    from ..format import Encryptor
    from ..locks import Lock

__all__ = ["PgStore"]

T = TypeVar("T")


class PgStore:
    """One PostgreSQL log (a schema and a log name in a database).

    Args:
        location: A ``postgresql://`` URL (see :mod:`agent_saga.wal.pg`).

    Raises:
        SagaUsageError: the URL or one of our parameters is invalid;
            ``MissingExtra`` when psycopg is not installed.

    Attributes:
        location: The location as given (never print it).
        display: The location with its password masked.
        kind: ``"postgresql"``.
        loc: The parsed location.
    """

    kind = "postgresql"

    def __init__(self, location: str) -> None:
        self._pg = psycopg_module()
        self.location = location
        self.loc: PgLocation = parse_location(location)
        self.display = self.loc.display
        self._local = threading.local()
        # Every read connection this store opened (one per thread): closed when the
        # store is closed or garbage-collected, never left to psycopg's __del__.
        self._conns: list[tuple[int, Any]] = []
        self._finalizer = weakref.finalize(self, _close_conns, self._conns)

    def __repr__(self) -> str:
        return f"PgStore({self.display!r})"

    # -- plumbing

    def _conn(self) -> Any:
        local = self._local
        c = getattr(local, "conn", None)
        if c is None or local.pid != os.getpid() or c.closed or c.broken:
            if c is not None and local.pid == os.getpid():
                with contextlib.suppress(Exception):
                    c.close()
            local.conn = None
            local.conn = self.loc.connect("read")
            local.pid = os.getpid()
            self._conns.append((local.pid, local.conn))
        return local.conn

    def _call(self, what: str, fn: Callable[[Any], T]) -> T:
        try:
            return fn(self._conn())
        except self._pg.Error as exc:
            raise self.loc.error(exc, what) from None

    def close(self) -> None:
        """Close the store's read connections (writers are closed on their own)."""
        self._local.conn = None
        _close_conns(self._conns)

    # -- LogStore

    def check(self, *, must_exist: bool) -> None:
        """Refuse a location that cannot be a log, before anything is created.

        Raises:
            SchemaMissing: no (or an older) log schema, and ``must_exist`` or the URL
                does not allow writers to migrate: run ``agent-saga db migrate``.
            NoWAL: ``must_exist`` and the schema holds no log of that name.
            PgWALError: the database cannot be reached, or its schema is newer.
        """

        def run(conn: Any) -> None:
            found = schema_version(conn, self.loc)
            if found > SCHEMA_VERSION:
                raise PgWALError(
                    f"the PostgreSQL log at {self.display} has schema version {found}, "
                    f"newer than this agent-saga knows ({SCHEMA_VERSION}): upgrade agent-saga",
                    path=self.display,
                )
            if found < SCHEMA_VERSION:
                if must_exist or not self.loc.auto_migrate:
                    raise SchemaMissing(self.display, found)
                return
            if must_exist and read_log_row(conn, self.loc) is None:
                raise NoWAL(self.display)

        self._call("cannot read the PostgreSQL log", run)

    def exists(self) -> bool:
        """Whether the schema is there and holds this log."""

        def run(conn: Any) -> bool:
            if schema_version(conn, self.loc) != SCHEMA_VERSION:
                return False
            return read_log_row(conn, self.loc) is not None

        return self._call("cannot read the PostgreSQL log", run)

    def writer(
        self, *, encryptor: Encryptor | None = None, lease_seconds: float = 30.0
    ) -> PgWriter:
        """This process's shared :class:`~agent_saga.wal.pg.PgWriter` for the log."""
        return open_pg_writer(self.loc, encryptor=encryptor, lease_seconds=lease_seconds)

    def scan(
        self, start: int = 0, *, decryptor: Decryptor | None = None
    ) -> Iterator[Record | Damage]:
        """Every record and damaged row at or after cursor ``start``, in seq order.

        A missing schema or log reads as empty (as a missing file does).

        Raises:
            WALKeyMissing: the log is encrypted and no key is configured.
            WALAuthenticationFailed: the key is not the log's.
            PgWALError: the database cannot be reached.
        """
        try:
            conn = self._conn()
            if schema_version(conn, self.loc) != SCHEMA_VERSION:
                return
            row = read_log_row(conn, self.loc)
            if row is None:
                return
            yield from scan_log(self._conn, self.loc, start, decryptor, row)
        except self._pg.Error as exc:
            raise self.loc.error(exc, "cannot read the PostgreSQL log") from None

    def end(self) -> int:
        """The cursor after the last committed record (the committed ``next_seq``; 0 if none).

        Every seq below it is committed: seqs are taken under the log row lock held
        until COMMIT, and ``next_seq`` is read as committed.
        """

        def run(conn: Any) -> int:
            if schema_version(conn, self.loc) != SCHEMA_VERSION:
                return 0
            got = conn.execute(
                sql(self.loc, "SELECT next_seq FROM {s}.logs WHERE name = %s"), (self.loc.log,)
            ).fetchone()
            return 0 if got is None else int(got[0])

        return self._call("cannot read the PostgreSQL log", run)

    def identity(self) -> Hashable | None:
        """The log and its compaction: changes when the log is dropped and created
        again, and when it is compacted (a reader then reads it again from the start:
        the ``compaction`` record says where removed rows were; log-format §12.7)."""

        def run(conn: Any) -> Hashable | None:
            if schema_version(conn, self.loc) != SCHEMA_VERSION:
                return None
            row = read_log_row(conn, self.loc)
            if row is None:
                return None
            return (row.log_id, hashlib.sha256(row.compaction).hexdigest())

        return self._call("cannot read the PostgreSQL log", run)

    def leases(self) -> PgLeaseTable:
        """The lease table (read-only: revoke inside ``writer().exclusive()``)."""

        def run(conn: Any) -> str:
            if schema_version(conn, self.loc) != SCHEMA_VERSION:
                return ""
            row = read_log_row(conn, self.loc)
            return "" if row is None else row.log_id

        log_id = self._call("cannot read the PostgreSQL log", run)
        return PgLeaseTable(self._conn, self.loc, log_id)

    def now(self) -> float:
        """The database's clock, in epoch seconds: leases and claims are judged by it."""
        return self._call("cannot read the PostgreSQL clock", db_now)

    def verify(self, decryptor: Decryptor | None = None) -> VerifyReport:
        """Check every row; report damage (by seq) without stopping.

        Raises:
            WALKeyMissing: the log is encrypted and no key is configured.
            WALAuthenticationFailed: the key is not the log's.
            PgWALError: the database cannot be reached.
        """
        report = VerifyReport(path=self.display)
        conn = self._call("cannot read the PostgreSQL log", lambda c: c)
        try:
            if schema_version(conn, self.loc) != SCHEMA_VERSION:
                return report
            row = read_log_row(conn, self.loc)
            if row is None:
                return report
            report.encrypted = row.encrypted
            size = conn.execute(
                sql(
                    self.loc,
                    "SELECT coalesce(sum(octet_length(frame)), 0)::bigint FROM {s}.records "
                    "WHERE log_id = %s",
                ),
                (row.log_id,),
            ).fetchone()
            report.size = int(size[0]) + len(row.header) + len(row.compaction)
        except self._pg.Error as exc:
            raise self.loc.error(exc, "cannot read the PostgreSQL log") from None
        for item in self.scan(decryptor=decryptor):
            if isinstance(item, Record):
                t = item.data["type"]
                report.by_type[t] = report.by_type.get(t, 0) + 1
                if t == TAIL_REPAIRED:
                    report.repairs.append(item.data)
                if not item.meta:
                    report.records += 1
            else:
                report.damages.append(item)
        return report

    def compact(self, **options: Any) -> CompactionReport:
        """Retention: see :func:`agent_saga.wal.pg._compact.compact_pg`."""
        from ._compact import compact_pg

        return compact_pg(self, **options)

    def migrate(self) -> MigrateReport:
        """Create or upgrade the log schema (idempotent): ``agent-saga db migrate``."""
        return migrate(self.loc)

    def recovery_lock(self) -> Lock:
        """The daemon's per-saga lock: a PostgreSQL advisory lock when available.

        Correctness does not rest on it (claims are written under the log row lock);
        it only keeps two daemons from working on the same saga at once.
        """
        from ._advisory_lock import PgAdvisoryLock

        return PgAdvisoryLock(
            self.loc.url, password=_ref(self.loc), table=f"{self.loc.schema}.lock_fence"
        )


def _close_conns(conns: list[tuple[int, Any]]) -> None:
    me = os.getpid()
    while conns:
        pid, c = conns.pop()
        if pid == me:
            with contextlib.suppress(Exception):
                c.close()


def _ref(loc: PgLocation) -> Any:
    if loc.password_ref is None:
        return None
    from ...secrets import CredentialRef

    return CredentialRef(loc.password_ref)
