"""How the PostgreSQL writer commits batches (``docs/log-format.md`` §11.3).

A base class of :class:`~agent_saga.wal.pg.PgWriter`, on the queue shared with the
file writer (:class:`~agent_saga.wal._queue.QueueWriter`): the enqueue side, the
flusher that commits everything queued as one ``append_batch`` statement, finding
out whether a commit whose connection broke landed (the old session is terminated
first, then the lease row's ``last_batch`` is read on a new connection), fencing,
and the thread that renews the lease on the database's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..._crash import crashpoint
from ...errors import LeaseLost, SagaUsageError, WALError
from .._batch import _Batch
from .._queue import QueueWriter
from ._location import PgLocation, PgWriteFailed, app_name
from ._schema import LEASE_LOST, NO_LOG, sql

__all__ = ["PgBatches", "waiter_error"]


def waiter_error(err: BaseException) -> BaseException:
    """A new exception per waiter (one shared instance would gather tracebacks)."""
    if isinstance(err, LeaseLost):
        return LeaseLost(str(err))
    if isinstance(err, PgWriteFailed):
        return PgWriteFailed(str(err), path=err.path, sqlstate=err.sqlstate, outcome=err.outcome)
    return PgWriteFailed(str(err), path=getattr(err, "path", None))


class PgBatches(QueueWriter):
    """Batching, committing and the lease of the PostgreSQL writer (set up by :class:`PgWriter`).

    ``_conn`` is the flusher's connection, ``_pg`` the psycopg module,
    ``_append_sql`` the ``append_batch`` statement; ``_pending`` holds
    ``(saga id, frame)`` pairs.
    """

    loc: PgLocation
    log_id: str
    _conn: Any
    _pg: Any
    _append_sql: Any
    _lease_seconds: float
    _resolve_timeout: float
    _pending: list[tuple[str | None, bytes]]

    def _fresh(self, err: BaseException) -> BaseException:
        return waiter_error(err)

    def _wake_flusher_locked(self) -> None:
        self._flusher_idle = False
        self._cond.notify()

    def _enqueue(
        self,
        saga: str | None,
        frame: bytes,
        fut: asyncio.Future[None] | None,
        loop: asyncio.AbstractEventLoop | None,
        block: bool = True,
        waited: bool = True,
    ) -> _Batch:
        if self._defunct:
            raise SagaUsageError(
                "this WAL writer belongs to the parent process; open the store again in the child"
            )
        with self._lock:
            if self._closing or self._fenced:
                self._raise_unusable()
            if len(self._pending) >= self._limit:
                self._wait_for_room(block)
            self._pending.append((saga, frame))
            batch = self._current
            if not waited:
                batch.unwaited = True
            if fut is not None and loop is not None:
                self._add_waiter(batch, fut, loop)
            if waited and self._flusher_idle:
                self._wake_flusher_locked()
            return batch

    # -- flusher

    def _run_flusher(self) -> None:
        while True:
            with self._lock:
                while not self._pending:
                    if self._closing:
                        return
                    self._flusher_idle = True
                    self._cond.wait()
                self._flusher_idle = False
                batch = self._current
                frames, self._pending, self._current = self._pending, [], _Batch()
                self._inflight = batch
                if self._blocked:
                    self._room.notify_all()
            try:
                batch.error = self._commit(frames)
            except BaseException as exc:  # never leave a waiter hanging
                batch.error = PgWriteFailed(
                    f"committing {len(frames)} record(s) to {self.path} failed ({exc!r})",
                    path=self.path,
                )
            self._complete(batch)

    def _flusher_conn(self) -> Any:
        c = self._conn
        if c is None or c.closed or c.broken:
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
            self._conn = None
            c = self._conn = self.loc.connect("writer", owner=self.owner)
        return c

    def _commit(self, frames: list[tuple[str | None, bytes]]) -> BaseException | None:
        """Commit one batch; return the error every waiter gets, or None."""
        if self._fenced:
            return self._lease_lost()
        n = len(frames)
        try:
            conn = self._flusher_conn()
        except WALError as exc:
            self.stats.failed_batches += 1
            return PgWriteFailed(
                f"committing {n} record(s) to {self.path} failed: {exc}; they are not durable",
                path=self.path,
            )
        batch_id = uuid.uuid4().hex
        pid = conn.info.backend_pid
        params = (
            self.log_id,
            self.owner,
            batch_id,
            self._lease_seconds,
            False,
            [s for s, _ in frames],
            [f for _, f in frames],
        )
        crashpoint("wal.before_write")
        try:
            conn.execute(self._append_sql, params)
        except self._pg.Error as exc:
            code = getattr(exc, "sqlstate", None)
            if not conn.broken:
                self.stats.failed_batches += 1
                if code == LEASE_LOST:
                    self._fence()
                    return self._lease_lost()
                why = "the log was dropped" if code == NO_LOG else self.loc.describe(exc)
                return PgWriteFailed(
                    f"committing {n} record(s) to {self.path} failed: {why}; they are not durable",
                    path=self.path,
                    sqlstate=code,
                )
            # The connection broke during the statement: it may have committed.
            with contextlib.suppress(Exception):
                conn.close()
            self._conn = None
            committed = self._resolve(batch_id, pid)
            if committed is not True:
                self.stats.failed_batches += 1
                if committed is False:
                    return PgWriteFailed(
                        f"committing {n} record(s) to {self.path} failed "
                        f"({self.loc.describe(exc)}); checked afterwards: they are not in "
                        "the log",
                        path=self.path,
                        sqlstate=code,
                    )
                return PgWriteFailed(
                    f"committing {n} record(s) to {self.path} failed "
                    f"({self.loc.describe(exc)}) and the database stayed unreachable for "
                    f"{self._resolve_timeout:g}s: they are not acknowledged and may or may "
                    "not be in the log",
                    path=self.path,
                    sqlstate=code,
                    outcome="unknown",
                )
        crashpoint("wal.after_write")
        crashpoint("wal.after_fsync")
        self.stats.fsyncs += 1
        self.stats.batches += 1
        self.stats.records_written += n
        self.stats.bytes_written += sum(len(f) for _, f in frames)
        return None

    def _resolve(self, batch_id: str, old_pid: int) -> bool | None:
        """Whether batch ``batch_id`` committed: True, False, or None (unreachable)."""
        q = sql(self.loc, "SELECT last_batch FROM {s}.leases WHERE log_id = %s AND owner = %s")

        def committed(c: Any) -> bool:
            got = c.execute(q, (self.log_id, self.owner)).fetchone()
            return got is not None and got[0] == batch_id

        return self._after_session(app_name("writer", self.owner), old_pid, committed)

    def _after_session(self, app: str, old_pid: int, check: Callable[[Any], bool]) -> bool | None:
        """``check(conn)`` once the session ``old_pid`` (named ``app``) is surely gone.

        Terminate the session that sent a commit whose answer was lost, wait until it
        is gone (so it cannot commit after we looked), then look, on a new
        connection. Retries with backoff until ``resolve_timeout``; None if the
        database could not be reached by then.
        """
        deadline = time.monotonic() + self._resolve_timeout
        delay = 0.05
        while True:
            try:
                c = self.loc.connect("resolve", owner=self.owner, timeout=5)
                try:
                    while c.execute(
                        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
                        "WHERE pid = %s AND application_name = %s",
                        (old_pid, app),
                    ).fetchall():
                        if time.monotonic() > deadline:
                            return None
                    return check(c)
                finally:
                    c.close()
            except (WALError, self._pg.Error):
                if time.monotonic() > deadline:
                    return None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _fence(self) -> None:
        self._fenced = True
        with self._lock:
            self._room.notify_all()

    # -- lease renewal

    def _run_renewer(self) -> None:
        interval = self._lease_seconds / 3
        conn: Any = None
        renew = sql(
            self.loc,
            "UPDATE {s}.leases SET expires = clock_timestamp() + make_interval(secs => %s), "
            "renewed = clock_timestamp() WHERE log_id = %s AND owner = %s AND state = 'live'",
        )
        try:
            while not self._stop.wait(interval):
                try:
                    if conn is None or conn.broken:
                        conn = self.loc.connect("lease", owner=self.owner)
                    cur = conn.execute(renew, (self._lease_seconds, self.log_id, self.owner))
                    if cur.rowcount == 0 and not self._stop.is_set():
                        self._fence()  # revoked (or its row deleted): fenced for good
                        return
                except Exception:  # transient: every batch renews the lease too
                    if conn is not None:
                        with contextlib.suppress(Exception):
                            conn.close()
                    conn = None
                    continue
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
