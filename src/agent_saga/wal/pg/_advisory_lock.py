"""A PostgreSQL advisory lock for recovery daemons on several hosts (extra ``postgres``).

The default lock of a ``postgresql://`` log (:meth:`PgStore.recovery_lock
<agent_saga.wal.pg.PgStore.recovery_lock>`), and what ``saga-recoveryd --lock
postgresql://…`` uses; documented as :mod:`agent_saga.recovery.locks_pg`, which
re-exports it.

A grant is ``pg_try_advisory_lock(k)`` on one dedicated session connection per
:class:`PgAdvisoryLock`, where ``k`` is a 64-bit digest of the key
(:func:`advisory_key`: look it up in ``pg_locks`` as ``classid``/``objid``). A
session-level advisory lock lives exactly as long as the session, the way a
``flock`` lives as long as its process: a holder that is killed, or whose
connection drops, frees the key at once, with no TTL to wait out (``ttl`` is
accepted and ignored).

The fencing token comes from a small table, created idempotently on first use::

    INSERT INTO agent_saga_lock_fence (key, fence) VALUES (%s, 1)
    ON CONFLICT (key) DO UPDATE SET fence = agent_saga_lock_fence.fence + 1
    RETURNING fence

run right after the advisory lock was granted, so tokens strictly grow with every
grant. The table name is fixed (or given, and then quoted with
``psycopg.sql.Identifier``); keys are always bound parameters.

:meth:`PgAdvisoryLock.held` asks the session (one round trip): True only while the
connection that took the grant still answers. Connecting, and every statement,
has a timeout; a server that is down makes :meth:`~PgAdvisoryLock.acquire` return
None and log one warning (the daemon skips the saga: fail closed).

The password comes from libpq's usual places (``PGPASSWORD``, ``~/.pgpass``, a
service file), the URL, or a :class:`~agent_saga.connectors.CredentialRef`; the URL is only
ever printed with ``***`` in place of a password.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from typing import Any
from urllib.parse import urlsplit

from ..._credentials import resolve_credential
from ...errors import MissingExtra, SagaUsageError, install_hint
from ...secrets import CredentialRef
from ..locks import RemoteLockHealth, redact_url

__all__ = ["PgAdvisoryLock", "advisory_key"]

_log = logging.getLogger("agent_saga.recovery.locks")

DEFAULT_TABLE = "agent_saga_lock_fence"


def advisory_key(key: str) -> int:
    """The signed 64-bit advisory-lock key for ``key`` (first 8 bytes of its SHA-256).

    In ``pg_locks`` it appears as ``classid`` (high 32 bits) and ``objid`` (low 32
    bits) with ``objsubid = 1``.
    """
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big", signed=True)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise MissingExtra(
            "the PostgreSQL lock (saga-recoveryd --lock postgresql://…) needs the "
            f"'postgres' extra: {install_hint('postgres')} (import psycopg "
            f"failed: {type(exc).__name__})",
            extra="postgres",
            package="psycopg",
        ) from None
    return psycopg


class PgAdvisoryLock(RemoteLockHealth):
    """Mutual exclusion per key with PostgreSQL session advisory locks and a fence table.

    Args:
        url: A libpq URL, ``postgresql://[user@]host[:port]/dbname[?options]``.
        password: A credential reference for the password, resolved when the session
            is opened; or leave it to libpq (``PGPASSWORD``, ``~/.pgpass``, …).
        timeout: Seconds allowed for connecting and for every statement.
        table: The fence table (default ``agent_saga_lock_fence``); may be
            ``"schema.table"``. Quoted as an identifier, never formatted as SQL.

    Raises:
        SagaUsageError: not a ``postgresql://`` URL, a bad table name or timeout.
            ``MissingExtra`` when psycopg is not installed.
    """

    service = "PostgreSQL"

    def __init__(
        self,
        url: str,
        *,
        password: CredentialRef | None = None,
        timeout: float = 5.0,
        table: str = DEFAULT_TABLE,
    ) -> None:
        self._pg = _psycopg()
        self.url = redact_url(url)
        """The URL, with its password replaced by ``***`` (safe to print)."""
        try:
            scheme = urlsplit(url).scheme
        except ValueError:
            scheme = ""
        if scheme not in ("postgresql", "postgres"):
            raise SagaUsageError(f"not a PostgreSQL URL: {self.url}; write postgresql://…")
        if password is not None and not isinstance(password, CredentialRef):
            raise SagaUsageError(
                "PgAdvisoryLock(password=...) takes a CredentialRef, not the password "
                "itself; or leave it to PGPASSWORD / ~/.pgpass"
            )
        if not timeout > 0:
            raise SagaUsageError(f"PgAdvisoryLock timeout must be > 0 seconds, got {timeout!r}")
        parts = table.split(".")
        if not 1 <= len(parts) <= 2 or not all(parts) or any("\x00" in p for p in parts):
            raise SagaUsageError(
                f"PgAdvisoryLock table must be 'name' or 'schema.name', got {table!r}"
            )
        self._url = url
        self._password_ref = password
        self._timeout = float(timeout)
        self._table = self._pg.sql.Identifier(*parts)
        self._conn: Any = None
        self._held: dict[str, int] = {}  # key -> token, on the current session
        self._guard = threading.Lock()  # one statement at a time on the session
        """Why the last call to PostgreSQL failed (redacted), None after a success."""

    def __repr__(self) -> str:
        return f"PgAdvisoryLock({self.url!r})"

    # -- plumbing (called with the guard held) ----------------------------------------

    def _session(self) -> Any:
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        self._drop_session()
        kwargs: dict[str, Any] = {
            "autocommit": True,  # every statement its own transaction; none left open
            "connect_timeout": max(1, round(self._timeout)),
            "application_name": "agent-saga-lock",
            "options": f"-c statement_timeout={round(self._timeout * 1000)}",
            # A peer that vanished is noticed by the kernel, not after hours.
            "keepalives": 1,
            "keepalives_idle": max(1, round(self._timeout)),
            "keepalives_interval": 1,
            "keepalives_count": 3,
            "tcp_user_timeout": round(self._timeout * 1000),
        }
        if self._password_ref is not None:
            kwargs["password"] = resolve_credential(self._password_ref)
        conn = self._pg.connect(self._url, **kwargs)
        try:
            self._create_table(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _create_table(self, conn: Any) -> None:
        sql = self._pg.sql
        create = sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, fence bigint NOT NULL)"
        ).format(self._table)
        try:
            conn.execute(create)
        except self._pg.errors.UniqueViolation:
            # Two sessions raced through IF NOT EXISTS: the other one created it.
            conn.execute(create)

    def _drop_session(self) -> None:
        """Forget the session; its advisory locks die with it."""
        if self._conn is not None:
            with contextlib.suppress(self._pg.Error):
                self._conn.close()
        self._conn = None
        self._held.clear()

    # -- the Lock interface -----------------------------------------------------------

    def acquire(self, key: str, *, ttl: float) -> int | None:
        """Take ``key`` until released or until this lock's session ends.

        Args:
            key: What to lock (the daemon uses saga ids).
            ttl: Ignored: the grant lives as long as the session, which dies with
                the process or the connection.

        Returns:
            The fencing token, strictly greater than every token granted before on
            ``key``; None when another session holds it, this lock already holds it,
            or PostgreSQL cannot be reached (a warning is logged; :attr:`last_error`
            says why).
        """
        lock_key = advisory_key(key)
        sql = self._pg.sql
        with self._guard:
            if key in self._held:
                return None  # advisory locks stack within a session: refuse here
            try:
                conn = self._session()
                got = conn.execute("SELECT pg_try_advisory_lock(%s)", (lock_key,)).fetchone()
                if not (got and got[0]):
                    self._ok()
                    return None
                try:
                    row = conn.execute(
                        sql.SQL(
                            "INSERT INTO {t} (key, fence) VALUES (%s, 1) ON CONFLICT (key) "
                            "DO UPDATE SET fence = {t}.fence + 1 RETURNING fence"
                        ).format(t=self._table),
                        (key,),
                    ).fetchone()
                except BaseException:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (lock_key,))
                    raise
            except self._pg.Error as exc:
                self._failed("acquire", exc)
                self._drop_session()
                return None
            self._ok()
            token = int(row[0])
            self._held[key] = token
            return token

    def held(self, key: str, token: int) -> bool:
        """Whether this lock's session still holds ``key`` under ``token``.

        One round trip to the server: False once the session is gone (the server
        was restarted, the connection dropped or was terminated), since the
        advisory lock went with it.
        """
        with self._guard:
            if self._held.get(key) != token or self._conn is None:
                return False
            try:
                self._conn.execute("SELECT 1").fetchone()
            except self._pg.Error as exc:
                self._failed("held", exc)
                self._drop_session()
                return False
            return True

    def release(self, key: str, token: int) -> None:
        """Unlock ``key`` if this lock's session holds it under ``token``; else nothing.

        Never raises for the server being unreachable: a broken session holds
        nothing any more.
        """
        with self._guard:
            if self._held.get(key) != token:
                return
            del self._held[key]
            if self._conn is None:
                return
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (advisory_key(key),))
            except self._pg.Error as exc:
                self._failed("release", exc)
                self._drop_session()

    def close(self) -> None:
        """Close the session (which releases every key it holds)."""
        with self._guard:
            self._drop_session()
