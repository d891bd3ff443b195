"""The PostgreSQL log writer: client-side group commit, leases on the database clock.

One :class:`PgWriter` per (process, location), shared through :func:`open_pg_writer`.
Callers encode their record (and seal it, with a key) in their own thread and
enqueue it; one flusher thread takes everything queued and commits it as one
statement, ``SELECT <schema>.append_batch(...)``, in its own autocommit transaction:

1. ``UPDATE logs SET next_seq = next_seq + n`` allocates the batch's seqs and takes
   the log row's lock, held until COMMIT: commit order is seq order, so a reader that
   resumes after seq ``k`` never misses a row below ``k`` committed later;
2. ``UPDATE leases ... WHERE state = 'live'`` renews this writer's lease and records
   the batch id (a fresh snapshot, taken after the lock: a revocation, made holding
   the same lock, is always seen; none found raises ``AS001`` -> ``LeaseLost``);
3. ``INSERT`` the rows from two arrays (``unnest``): one round trip per batch.

Every waiter of the batch is released after COMMIT returns, or gets the error. When
the connection breaks during the statement the outcome is unknown: the flusher
reconnects, makes sure the old session is gone (``pg_terminate_backend``), and reads
the lease row's ``last_batch``: equal to the batch's id means committed (acknowledged),
anything else means it is not in the log (``PgWriteFailed``). ``docs/log-format.md``
§11.3 is the normative description.

This module holds the writer's constructor, its public methods and the
``exclusive()`` block, and the registry behind :func:`open_pg_writer`; the batching,
the commit and its lost-answer check, and the lease renewal are its base class's
(``wal/pg/_batches.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import SagaUsageError, WALFull
from .._batch import WriterStats, _Batch
from .._queue import Backpressure, check_queue_args
from .._writers import Registry
from ..format import Encryptor, encode_record
from ..reader import Record
from ..records import ESCALATED, HALT, RESUME
from ..salt import SaltPool
from ..tail import header_record
from ._batches import PgBatches, waiter_error
from ._exclusive import PgExclusive
from ._location import PgLocation, PgWriteFailed, app_name, psycopg_module
from ._rows import LogRow, decode_row, log_header_fields, read_log_row
from ._schema import require_schema, sql

__all__ = ["PgWriter", "open_pg_writer"]

_APPEND = "SELECT {s}.append_batch(%s, %s, %s, %s, %s, %b::text[], %b::bytea[])"


def saga_of(record: Mapping[str, Any]) -> str | None:
    """The clear saga id stored beside a frame (``None`` for records of no saga)."""
    saga = record.get("saga")
    return saga if isinstance(saga, str) else None


def open_log(conn: Any, loc: PgLocation, encryptor: Encryptor | None) -> LogRow:
    """The log's row, created with its header when missing; the mode rule applied.

    Raises:
        WALKeyMissing, WALAuthenticationFailed, WALEncryptionMismatch: the mode rule
            of ``docs/log-format.md`` §1 refuses this writer (nothing was written).
    """
    from ..tail import check_mode

    row = read_log_row(conn, loc)
    if row is None:
        frame = header_record(encryptor)
        fields = log_header_fields(frame)
        conn.execute(
            sql(
                loc,
                "INSERT INTO {s}.logs (name, log_id, header, encrypted, key_id, key_check) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
            ),
            (
                loc.log,
                fields["log"],
                frame,
                fields.get("encryption") is not None,
                fields.get("key_id"),
                fields.get("key_check"),
            ),
        )
        row = read_log_row(conn, loc)
        assert row is not None
    check_mode(row.mode(), encryptor, loc.display)
    return row


class PgWriter(PgBatches):
    """Appends records to one PostgreSQL log with group commit. Use :func:`open_pg_writer`.

    Args:
        loc: The parsed location.
        encryptor: Seals every record; default: the ``AGENT_SAGA_WAL_KEY`` key if set.
        lease_seconds: Lease duration on the database's clock; renewed every third
            of it by a daemon thread, and by every batch.
        queue_limit: Most records waiting before backpressure applies.
        backpressure: ``"raise"`` (``WALFull`` at once) or ``"block"`` (wait up to
            ``block_timeout`` seconds, then ``WALFull``). Nothing is ever dropped.
        block_timeout: Seconds ``"block"`` waits for room.
        resolve_timeout: How long the flusher keeps trying to reach the database to
            learn the outcome of a commit whose connection broke.

    Raises:
        SagaUsageError: an argument is invalid.
        SchemaMissing: the schema is missing and the location does not allow
            writers to migrate (``agent_saga_auto_migrate=1``).
        PgWALError: the database cannot be reached.
        WALKeyMissing, WALAuthenticationFailed, WALEncryptionMismatch: the mode rule.

    Attributes:
        path: The location, password masked (for messages).
        owner: Random id of this writer (uuid4 hex), the key of its lease.
        stats: Counters: ``batches`` (= commits) < ``records_written`` proves group
            commit; ``fsyncs`` counts commits too.
        log_id: The log's id.
    """

    def __init__(
        self,
        loc: PgLocation,
        *,
        encryptor: Encryptor | None = None,
        lease_seconds: float = 30.0,
        queue_limit: int = 65536,
        backpressure: Backpressure = "raise",
        block_timeout: float = 5.0,
        resolve_timeout: float = 30.0,
    ) -> None:
        check_queue_args(queue_limit, backpressure, block_timeout, lease_seconds)
        if resolve_timeout < 0:
            raise SagaUsageError(f"resolve_timeout must be >= 0, not {resolve_timeout!r}")
        if encryptor is None:
            from ..encryption import encryptor_from_env

            encryptor = encryptor_from_env()
        self._pg = psycopg_module()
        self.loc = loc
        self.path = loc.display
        self.owner = uuid.uuid4().hex
        self.stats = WriterStats()
        self._encryptor = encryptor
        self._salts = SaltPool()  # one salt per saga record (docs/log-format.md §12.7)
        self._init_queue(queue_limit, backpressure, block_timeout)
        self._lease_seconds = float(lease_seconds)
        self._resolve_timeout = resolve_timeout
        self._append_sql = sql(loc, _APPEND)

        self._pending: list[tuple[str | None, bytes]] = []
        self._xlock = threading.Lock()
        self._xconn: Any = None
        self._rconn: Any = None  # reads the kill switch's records (halt_records)
        self._rlock = threading.Lock()
        self._rrow: LogRow | None = None

        conn = loc.connect("writer", owner=self.owner)
        try:
            require_schema(conn, loc, may_migrate=loc.auto_migrate)
            row = open_log(conn, loc, encryptor)
            self.log_id = row.log_id
            # The lease exists before any record: an owner without one is dead.
            conn.execute(
                sql(
                    loc,
                    "INSERT INTO {s}.leases (log_id, owner, host, pid, expires, renewed, state) "
                    "VALUES (%s, %s, %s, %s, clock_timestamp() + make_interval(secs => %s), "
                    "clock_timestamp(), 'live')",
                ),
                (self.log_id, self.owner, socket.gethostname(), os.getpid(), self._lease_seconds),
            )
        except BaseException as exc:
            conn.close()
            if isinstance(exc, self._pg.Error):
                raise loc.error(exc, "cannot open the PostgreSQL log") from None
            raise
        self._conn: Any = conn
        self._stop = threading.Event()
        self._flusher = threading.Thread(
            target=self._run_flusher, name=f"agent-saga-pg-flusher-{self.owner[:8]}", daemon=True
        )
        self._renewer = threading.Thread(
            target=self._run_renewer, name=f"agent-saga-pg-lease-{self.owner[:8]}", daemon=True
        )
        self._flusher.start()
        self._renewer.start()
        _writers.track(self)

    def __repr__(self) -> str:
        return f"PgWriter({self.path!r}, owner={self.owner[:8]})"

    # ------------------------------------------------------------------ public API

    def submit(self, record: Mapping[str, Any]) -> None:
        """Queue ``record`` without waiting; it goes with the next batch someone waits for.

        Raises:
            WALFull: the queue is full.
            LeaseLost: this writer is fenced.
            SagaUsageError: closed, or the record cannot be encoded.
        """
        frame = encode_record(record, self._encryptor, self._salts.for_record(record))
        self._enqueue(saga_of(record), frame, None, None, waited=False)

    def append(self, record: Mapping[str, Any]) -> None:
        """Queue ``record`` and block until it (and all before it) is committed.

        Raises:
            PgWriteFailed: its batch was not committed; the record is not durable.
            LeaseLost: this writer is fenced; nothing of the batch was written.
            WALFull: as for :meth:`submit`.
            SagaUsageError: as for :meth:`submit`, or called inside ``exclusive()``.
        """
        self._not_in_exclusive()
        frame = encode_record(record, self._encryptor, self._salts.for_record(record))
        batch = self._enqueue(saga_of(record), frame, None, None)
        batch.event.wait()
        if batch.error is not None:
            raise waiter_error(batch.error) from batch.error.__cause__

    async def append_async(self, record: Mapping[str, Any]) -> None:
        """Like :meth:`append`, awaiting without blocking the event loop.

        Raises:
            PgWriteFailed, LeaseLost, WALFull, SagaUsageError: as for :meth:`append`.
        """
        self._not_in_exclusive()
        frame = encode_record(record, self._encryptor, self._salts.for_record(record))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        saga = saga_of(record)
        try:
            self._enqueue(saga, frame, fut, loop, block=False)
        except WALFull:
            if not self._block:
                raise
            await loop.run_in_executor(None, self._enqueue, saga, frame, fut, loop)
        await fut

    def append_fenced(self, record: Mapping[str, Any]) -> None:
        """Commit one ``escalated`` record even though this writer may be fenced.

        Raises:
            SagaUsageError: not an escalation, or the writer is closed.
            PgWriteFailed: the commit failed.
        """
        if record.get("type") != ESCALATED:
            raise SagaUsageError("append_fenced writes escalations only")
        if self.closed:
            raise SagaUsageError(f"WAL writer for {self.path} is closed")
        frame = encode_record(record, self._encryptor, self._salts.for_record(record))
        conn = self.loc.connect("escalation", owner=self.owner)
        try:
            conn.execute(
                self._append_sql,
                (
                    self.log_id,
                    self.owner,
                    None,
                    self._lease_seconds,
                    True,
                    [saga_of(record)],
                    [frame],
                ),
            )
        except self._pg.Error as exc:
            raise PgWriteFailed(
                f"writing an escalation to {self.path} failed: {self.loc.describe(exc)}",
                path=self.path,
                sqlstate=getattr(exc, "sqlstate", None),
                outcome="unknown" if conn.broken else "not_committed",
            ) from None
        finally:
            conn.close()
        self.stats.fsyncs += 1
        self.stats.batches += 1
        self.stats.records_written += 1

    def flush(self) -> None:
        """Block until every record queued so far is committed.

        Raises:
            PgWriteFailed: a batch of only-submitted records failed since the last flush.
            LeaseLost: this writer was fenced.
            SagaUsageError: called inside ``exclusive()`` from the same thread.
        """
        self._not_in_exclusive()
        with self._lock:
            if self._pending:
                if self._flusher_idle:
                    self._wake_flusher_locked()
                batch: _Batch | None = self._current
            else:
                batch = self._inflight
        if batch is not None:
            batch.event.wait()
        self._raise_unreported()

    async def flush_async(self) -> None:
        """Like :meth:`flush`, without blocking the event loop."""
        await asyncio.to_thread(self.flush)

    def close(self) -> None:
        """Flush, stop the threads, mark the lease released. Idempotent.

        Raises:
            PgWriteFailed: a batch of only-submitted records failed since the last flush.
            LeaseLost: only-submitted records were refused because the writer is fenced.
        """
        if not self._stop_threads():
            return
        # "Released" tells recovery this owner ended every saga it began; after a failed
        # commit that may be false (a saga_end may be what failed): let it expire instead.
        if not self._fenced and self.stats.failed_batches == 0:
            with contextlib.suppress(Exception):
                self._flusher_conn().execute(
                    sql(
                        self.loc,
                        "UPDATE {s}.leases SET state = 'released', expires = clock_timestamp() "
                        "WHERE log_id = %s AND owner = %s AND state = 'live'",
                    ),
                    (self.log_id, self.owner),
                )
        for c in (self._conn, self._xconn, self._rconn):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
        self._conn = self._xconn = self._rconn = None
        _writers.forget(self)
        self._raise_unreported()

    def halt_records(self, after: int) -> tuple[list[Record], int]:
        """The ``halt`` and ``resume`` records appended at or after cursor ``after``.

        What a gate reads, about once a second, to see a halt written by any process
        on any host (``wal/halts.py``): only rows without a saga are fetched (halts
        and resumes have none), through a connection of its own.

        Returns:
            The records, in order, and the cursor to read from next time.

        Raises:
            PgWALError: the database cannot be read.
        """
        q = sql(
            self.loc,
            "SELECT seq, frame FROM {s}.records WHERE log_id = %s AND seq >= %s "
            "AND saga IS NULL ORDER BY seq",
        )
        with self._rlock:
            try:
                c = self._rconn
                if c is None or c.closed or c.broken:
                    c = self._rconn = self.loc.connect("read", owner=self.owner)
                if self._rrow is None:
                    self._rrow = read_log_row(c, self.loc)
                row = self._rrow
                if row is None:
                    return [], after
                rows = c.execute(q, (self.log_id, max(after, 1))).fetchall()
            except self._pg.Error as exc:
                raise self.loc.error(exc, "cannot read the log's halts") from None
        out: list[Record] = []
        end = after
        for seq, frame in rows:
            item = decode_row(int(seq), bytes(frame), self._encryptor, row, self.loc)
            end = max(end, int(seq) + 1)
            if isinstance(item, Record) and item.data.get("type") in (HALT, RESUME):
                out.append(item)
        return out, end

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[PgExclusive]:
        """Flush, then hold the log row's lock in one transaction for the whole block.

        Every other append (every process) waits until the block ends. The block's
        ``append_locked`` records are committed when it exits normally (their
        waiters, the caller, learn the outcome there); if the block raises,
        everything it appended is rolled back and the exception propagates.

        Yields:
            A :class:`PgExclusive`: ``read_from``, ``append_locked``, ``leases``, ``now``.

        Raises:
            PgWriteFailed: flushing failed, or the commit at the block's exit failed
                (checked, like the flusher's, when the connection broke).
            PgWALError: the database cannot be reached.
            LeaseLost: this writer is fenced.
        """
        self.flush()
        with self._xlock:
            conn = self._exclusive_conn()
            handle = PgExclusive(self, conn)
            try:
                conn.execute("BEGIN")
                read_log_row(conn, self.loc, lock=True)
            except self._pg.Error as exc:
                self._drop_exclusive_conn()
                raise self.loc.error(exc, "cannot lock the PostgreSQL log") from None
            self._exclusive_thread = threading.get_ident()
            ok = False
            try:
                yield handle
                ok = True
            finally:
                handle._open = False
                self._exclusive_thread = None
                if not ok:
                    self._rollback_exclusive()
            self._commit_exclusive(handle)

    # -- exclusive

    def _exclusive_conn(self) -> Any:
        c = self._xconn
        if c is None or c.closed or c.broken:
            self._drop_exclusive_conn()
            c = self._xconn = self.loc.connect("exclusive", owner=self.owner)
        return c

    def _drop_exclusive_conn(self) -> None:
        if self._xconn is not None:
            with contextlib.suppress(Exception):
                self._xconn.close()
        self._xconn = None

    def _rollback_exclusive(self) -> None:
        try:
            self._xconn.execute("ROLLBACK")
        except Exception:
            self._drop_exclusive_conn()

    def _commit_exclusive(self, handle: PgExclusive) -> None:
        conn = self._xconn
        if handle.aborted is not None:
            self._rollback_exclusive()
            raise PgWriteFailed(
                f"the exclusive block on {self.path} was rolled back: an earlier statement "
                f"in it failed ({handle.aborted}); nothing it appended is durable",
                path=self.path,
            )
        pid = conn.info.backend_pid
        try:
            conn.execute("COMMIT")
        except self._pg.Error as exc:
            broken = conn.broken
            self._drop_exclusive_conn()
            if not handle.written:
                if broken:
                    return  # nothing was written: nothing to lose
                raise self.loc.error(exc, "committing the exclusive block failed") from None
            committed = self._resolve_rows(handle.written, pid) if broken else False
            if committed is not True:
                raise PgWriteFailed(
                    f"committing {sum(len(fs) for _, fs in handle.written)} record(s) to "
                    f"{self.path} failed ({self.loc.describe(exc)})"
                    + (
                        "; they are not in the log"
                        if committed is False
                        else "; the database stayed unreachable: they may or may not be in the log"
                    ),
                    path=self.path,
                    sqlstate=getattr(exc, "sqlstate", None),
                    outcome="not_committed" if committed is False else "unknown",
                ) from None
        self.stats.fsyncs += 1
        self.stats.batches += 1

    def _resolve_rows(self, written: list[tuple[int, list[bytes]]], old_pid: int) -> bool | None:
        """Whether the rows appended in an exclusive block are in the log, frame for frame."""
        q = sql(
            self.loc,
            "SELECT seq, frame FROM {s}.records WHERE log_id = %s AND seq >= %s AND seq < %s",
        )

        def landed(c: Any) -> bool:
            for base, frames in written:
                rows = dict(c.execute(q, (self.log_id, base, base + len(frames))).fetchall())
                if [bytes(rows.get(base + i, b"")) for i in range(len(frames))] != frames:
                    return False
            return True

        return self._after_session(app_name("exclusive", self.owner), old_pid, landed)


# ---------------------------------------------------------------------- registry

_writers: Registry[PgWriter] = Registry()


def open_pg_writer(
    loc: PgLocation,
    *,
    encryptor: Encryptor | None = None,
    lease_seconds: float = 30.0,
    **options: Any,
) -> PgWriter:
    """This process's writer for ``loc``, created on first use (options apply then only).

    Args:
        loc: The location.
        encryptor: See :class:`PgWriter`.
        lease_seconds: See :class:`PgWriter`.
        **options: ``queue_limit``, ``backpressure``, ``block_timeout``,
            ``resolve_timeout`` (see :class:`PgWriter`).

    Returns:
        The shared writer.

    Raises:
        As :class:`PgWriter`.
    """
    return _writers.shared(
        loc.key,
        lambda: PgWriter(loc, encryptor=encryptor, lease_seconds=lease_seconds, **options),
    )
