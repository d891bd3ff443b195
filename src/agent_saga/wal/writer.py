"""The WAL writer: bounded queue, group commit, multi-process appends, fencing.

One :class:`WALWriter` per (process, WAL path), shared through :func:`open_writer`.
Callers encode their record in their own thread and enqueue it; one flusher thread
takes everything queued, writes it with one ``write`` while holding the cross-process
lock — at the end of an ``O_APPEND`` file (format 1), or into the preallocated zeros
of a format-2 file —, releases the lock, fsyncs (format 2: ``fdatasync``) once, and
releases every waiter of that batch together (``docs/log-format.md`` §3-§6, §11).

This module holds the writer's constructor and public methods, and the per-process
registry behind :func:`open_writer` with its fork/exit hooks. The writer is built
on three base classes: the queue it shares with the PostgreSQL writer
(``wal/_queue.py``), how batches are formed, written and leased
(``wal/_file_batches.py``) and the file itself (``wal/_log_file.py``). Its I/O seam,
counters and batch live in ``wal/_batch.py``, the ``exclusive()`` handle in
``wal/exclusive.py``; the public names are re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import LeaseLost, SagaUsageError, WALError, WALFull, WALWriteFailed
from ._batch import WriterIO, WriterStats
from ._batch import _fresh as _waiter_error
from ._file_batches import INLINE_BATCH, FileBatches
from ._queue import Backpressure, check_queue_args
from ._writers import Registry
from .admission import Metered, new_ask, verdict
from .exclusive import ExclusiveHandle
from .format import Encryptor, encode_record
from .lease import OwnLease, ProcessLock
from .limits import LimitSpec, Overrun
from .records import ESCALATED
from .salt import SaltPool
from .tail import FORMAT_APPEND, FORMAT_PREALLOCATED

__all__ = [
    "DEFAULT_LOG_FORMAT",
    "INLINE_BATCH",
    "Backpressure",
    "ExclusiveHandle",
    "WALWriter",
    "WriterIO",
    "WriterStats",
    "encryptor_of_open_writer",
    "open_writer",
]

#: The layout new logs get when no ``log_format`` is given: the preallocated one,
#: measured at 0.5-0.85x the cost of append+fsync per durable write on this
#: project's reference disk (docs/performance.md, "Preallocated WAL").
DEFAULT_LOG_FORMAT: int = FORMAT_PREALLOCATED


class WALWriter(FileBatches):
    """Appends records to one WAL with group commit. Use :func:`open_writer`.

    Args:
        path: The WAL file (created if missing).
        encryptor: Seals every record; default: the ``AGENT_SAGA_WAL_KEY`` key if set.
        lease_seconds: Lease duration; renewed every third of it by a daemon thread.
        queue_limit: Most records waiting to be written before backpressure applies.
        backpressure: ``"raise"`` (``WALFull`` at once) or ``"block"`` (wait up to
            ``block_timeout`` seconds, then ``WALFull``). Nothing is ever dropped.
        block_timeout: Seconds ``"block"`` waits for room.
        log_format: The layout of a log this writer creates: 2 (preallocated) or 1
            (append); None: :data:`DEFAULT_LOG_FORMAT` (2). An existing log keeps
            its own layout; only compaction converts one (``docs/log-format.md`` §11).
        sync_on_loop: Who writes and syncs a small batch (at most
            :data:`INLINE_BATCH` records) an event loop hands over. None (the
            default, adaptive): the loop's own thread, but only when nothing else
            is runnable on the loop and this log's recent syncs were fast
            (:data:`INLINE_SYNC_LIMIT`), else the flusher thread — decided per
            batch; a lone async saga saves the two thread hand-offs per durable
            record, and a loop with other work, or a slow disk, is never made to
            wait (at worst one sync's time, when the loop becomes busy during it).
            True: the loop's thread always (at once when nothing else is
            runnable, else at the end of the loop iteration), whatever the disk.
            False: the flusher always. Larger batches go to the flusher in every
            mode, so under load syncs keep overlapping the loop's work
            (``docs/log-format.md`` §4).
        _io: Test seam for write/fsync/renewal.

    Raises:
        SagaUsageError: an argument is invalid.
        WALError: the WAL or its sidecar directory cannot be created or opened (the
            message names the path and the reason).
        WALKeyMissing: the log is encrypted and no key is configured.
        WALAuthenticationFailed: the log is encrypted with another key.
        WALEncryptionMismatch: a key is configured but the log is plaintext.

    Attributes:
        path: Absolute WAL path.
        owner: Random id of this writer (uuid4 hex), the key of its lease.
        stats: Counters (``fsyncs`` < records proves group commit).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        encryptor: Encryptor | None = None,
        lease_seconds: float = 30.0,
        queue_limit: int = 65536,
        backpressure: Backpressure = "raise",
        block_timeout: float = 5.0,
        log_format: int | None = None,
        sync_on_loop: bool | None = None,
        _io: WriterIO | None = None,
    ) -> None:
        if log_format is None:
            log_format = DEFAULT_LOG_FORMAT
        if log_format not in (FORMAT_APPEND, FORMAT_PREALLOCATED):
            raise SagaUsageError(f"log_format must be 1 or 2, not {log_format!r}")
        if sync_on_loop is not None and not isinstance(sync_on_loop, bool):
            raise SagaUsageError(
                f"sync_on_loop must be None (adaptive), True or False, not {sync_on_loop!r}"
            )
        check_queue_args(queue_limit, backpressure, block_timeout, lease_seconds)
        if encryptor is None:
            from .encryption import encryptor_from_env

            encryptor = encryptor_from_env()
        self.path = os.path.abspath(os.fspath(path))
        self.owner = uuid.uuid4().hex
        self.stats = WriterStats()
        self._encryptor = encryptor
        self._salts = SaltPool()  # one salt per saga record (docs/log-format.md §12.7)
        self._io = _io or WriterIO()
        self._init_queue(queue_limit, backpressure, block_timeout)
        self._lease_seconds = lease_seconds
        # Safety margin: the writer stops trusting its lease this long before other
        # processes may consider it expired (covers scheduling delay and small clock skew).
        self._margin = lease_seconds / 5

        self._pending: list[bytes | Metered] = []
        # True once someone waits for the pending records (a waited append, a flush):
        # only then is the flusher woken. Records that were only submitted (saga_begin)
        # wait for the next batch instead of costing an fsync of their own.
        self._wanted = False
        # Event loops with a hand-off scheduled for their current iteration: waited
        # records an event loop submits wake the flusher once per loop iteration, all
        # together, instead of the first of them waking it alone (docs/log-format.md §4).
        self._kicks: set[asyncio.AbstractEventLoop] = set()
        self._loop_handoff = True
        self._sync_on_loop = sync_on_loop
        # True while some thread (the flusher, or a sync caller leading a batch)
        # writes a batch: batches are written one at a time, in order.
        self._writing = False

        self._io_lock = threading.Lock()  # guards self._fd between flusher and exclusive()
        self._lease = OwnLease(self.path, self.owner, lease_seconds)
        # End of valid data as of this writer's last write, under the lock: when the
        # file's size still equals it, nobody else wrote since (docs/log-format.md §5).
        self._known_end: int | None = None
        self._create_format = log_format
        self._format = FORMAT_APPEND  # the attached log's layout, set by _attach_locked
        # Format 2: the file's size (its preallocation) as last seen; never more than
        # the real size (only a replacement shrinks a log), so writes below it are
        # inside the zeros, and only a batch that would cross it looks again.
        self._size = 0
        self._generation = 0  # the lock file's replacement generation at attach
        self._fd = -1
        try:
            parent = os.path.dirname(self.path)
            if not os.path.isdir(parent):
                # Never create a mistyped location's directories: say so instead.
                raise FileNotFoundError(errno.ENOENT, "its directory does not exist", parent)
            self._plock = ProcessLock(self.path)
            with self._plock:
                self._attach_locked()  # the mode rule: refuse before writing anything
                start = time.monotonic()
                self._lease.write_live()  # before any record: no lease file = dead owner
                self._deadline = start + lease_seconds - self._margin
        except BaseException as exc:
            if self._fd >= 0:
                os.close(self._fd)
            if hasattr(self, "_plock"):
                self._plock.close()
            if isinstance(exc, OSError):
                raise WALError(
                    f"cannot open the WAL at {self.path}: {exc.strerror or exc}; check that "
                    "its directory exists and is writable (--wal-path / AGENT_SAGA_WAL_PATH)",
                    path=self.path,
                ) from exc
            raise

        self._stop = threading.Event()
        self._flusher = threading.Thread(
            target=self._run_flusher, name=f"agent-saga-wal-flusher-{self.owner[:8]}", daemon=True
        )
        self._renewer = threading.Thread(
            target=self._run_renewer, name=f"agent-saga-wal-lease-{self.owner[:8]}", daemon=True
        )
        self._flusher.start()
        self._renewer.start()
        _writers.track(self)

    # ------------------------------------------------------------------ public API

    def submit(self, record: Mapping[str, Any]) -> None:
        """Enqueue a record without waiting; it is written, in order, with the next batch.

        It does not wake the flusher: nobody waits for it, and the record that
        follows it (an ``append``, a ``flush``, ``close``) takes it along in the same
        batch — one fsync for both, instead of one each (``docs/log-format.md`` §4).

        Args:
            record: A JSON-serialisable mapping with a string ``type``.

        Raises:
            WALFull: the queue is full (``raise`` policy, or ``block`` timed out).
            LeaseLost: this writer is fenced.
            SagaUsageError: the writer is closed, or the record cannot be encoded.
        """
        self._enqueue(
            encode_record(record, self._encryptor, self._salts.for_record(record)),
            None,
            None,
            waited=False,
        )

    def append(self, record: Mapping[str, Any]) -> None:
        """Submit a record and block until it (and all before it) is durable.

        Args:
            record: A JSON-serialisable mapping with a string ``type``.

        Raises:
            WALWriteFailed: its batch's write or fsync failed; the record is not durable.
            LeaseLost: this writer is fenced; nothing of the batch was written.
            WALFull: as for :meth:`submit`.
            SagaUsageError: as for :meth:`submit`, or called inside ``exclusive()``.
        """
        self._not_in_exclusive()
        data = encode_record(record, self._encryptor, self._salts.for_record(record))
        with self._lock:
            # The common case of a lone writer: nothing queued, nothing being written.
            # Write this one record here, with no batch object and no hand-off at all.
            solo = not (self._writing or self._pending or self._closing or self._fenced)
            if solo and not self._defunct:
                self._writing = True
            else:
                solo = False
        if solo:
            try:
                error = self._write_batch([data])
            finally:
                with self._lock:
                    self._writing = False
                    if self._flush_due_locked():
                        self._wake_flusher_locked()
            if error is not None:
                raise _waiter_error(error, self.path) from error.__cause__
            return
        batch = self._enqueue(data, None, None, lead=True)
        if batch.leader == threading.get_ident():
            # Nobody was writing: this thread writes the batch itself. Waking the
            # flusher and waiting for it would cost two thread hand-offs per record.
            self._write_and_complete(batch)
        else:
            batch.event.wait()
        if batch.error is not None:
            raise _waiter_error(batch.error, self.path) from batch.error.__cause__

    def append_fenced(self, record: Mapping[str, Any]) -> None:
        """Write one ``escalated`` record durably even though this writer is fenced.

        Fencing stops a process that lost its lease from changing a saga the daemon
        now owns. It must not silence it: a forward call that *completed* after the
        lease was lost is an effect nobody else knows about, and only this process
        can put it on the human queue. An escalation changes no saga state, so it is
        the one record a fenced writer may still write.

        Args:
            record: An ``escalated`` record.

        Raises:
            SagaUsageError: the record is not an escalation, or the writer is closed.
            WALWriteFailed: the write or fsync failed.
        """
        if record.get("type") != ESCALATED:
            raise SagaUsageError("append_fenced writes escalations only")
        if self._closed or self._defunct:
            raise SagaUsageError(f"WAL writer for {self.path} is closed")
        data = encode_record(record, self._encryptor, self._salts.for_record(record))
        try:
            with self._plock, self._io_lock:
                self._write_locked(data)
                self._sync()
        except OSError as exc:
            raise WALWriteFailed(
                f"writing an escalation to {self.path} failed ({exc!r})", path=self.path
            ) from exc
        self.stats.fsyncs += 1
        self.stats.records_written += 1

    async def append_async(self, record: Mapping[str, Any]) -> None:
        """Like :meth:`append`, but awaits without blocking the event loop.

        Args:
            record: A JSON-serialisable mapping with a string ``type``.

        Raises:
            WALWriteFailed: as for :meth:`append`.
            LeaseLost: as for :meth:`append`.
            WALFull: as for :meth:`submit` (``block`` waits in a worker thread).
            SagaUsageError: as for :meth:`submit`.
        """
        self._not_in_exclusive()
        data = encode_record(record, self._encryptor, self._salts.for_record(record))
        loop = asyncio.get_running_loop()
        if self._sync_on_loop is not False and not getattr(loop, "_ready", True) and self._fast():
            # Nothing else is runnable on this loop in this iteration, so no other
            # record of it can join a batch: write now, with no future and no loop
            # iteration in between (asyncio's private ready queue; another loop
            # implementation, without it, takes the path below).
            batch = self._lead_inline(data)
            if batch is not None:
                if batch.error is not None:
                    raise _waiter_error(batch.error, self.path) from batch.error.__cause__
                return
        await self._queued(data, loop)

    async def _queued(self, data: bytes | Metered, loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``data`` for the next batch and await its durability (the loop's hand-off)."""
        fut: asyncio.Future[None] = loop.create_future()
        try:
            self._enqueue(data, fut, loop, block=False, kick=True)
        except WALFull:
            if not self._block:
                raise
            # Never block the loop thread: wait for room in a worker thread.
            await loop.run_in_executor(None, self._enqueue, data, fut, loop)
        await fut

    def admit(
        self, record: Mapping[str, Any], specs: Mapping[str, LimitSpec], *, by: str
    ) -> Overrun | None:
        """Append a metered intent if its limits allow, in the next group commit.

        The batch's writer judges it holding the append lock, against what every
        process appended (``wal/admission.py``): no lock, read or fsync of its own.

        Returns:
            None once the intent is durable; the first limit it would exceed otherwise
            (nothing was written).

        Raises:
            UsageUnreadable: the log's usage cannot be read (fail closed).
            WALWriteFailed, LeaseLost, WALFull, SagaUsageError: as for :meth:`append`.
        """
        self._not_in_exclusive()
        ask = new_ask(record, specs, by)
        data = encode_record(record, self._encryptor, self._salts.for_record(record))
        batch = self._enqueue(Metered(data, ask), None, None, lead=True)
        if batch.leader == threading.get_ident():
            self._write_and_complete(batch)
        else:
            batch.event.wait()
        if batch.error is not None:
            raise _waiter_error(batch.error, self.path) from batch.error.__cause__
        return verdict(ask)

    async def admit_async(
        self, record: Mapping[str, Any], specs: Mapping[str, LimitSpec], *, by: str
    ) -> Overrun | None:
        """Like :meth:`admit`, but awaits without blocking the event loop."""
        self._not_in_exclusive()
        ask = new_ask(record, specs, by)
        metered = Metered(
            encode_record(record, self._encryptor, self._salts.for_record(record)), ask
        )
        loop = asyncio.get_running_loop()
        if self._sync_on_loop is not False and not getattr(loop, "_ready", True) and self._fast():
            batch = self._lead_inline(metered)  # as append_async: no hand-off when safe
            if batch is not None:
                if batch.error is not None:
                    raise _waiter_error(batch.error, self.path) from batch.error.__cause__
                return verdict(ask)
        await self._queued(metered, loop)
        return verdict(ask)

    def flush(self) -> None:
        """Block until everything submitted so far is durable.

        Raises:
            WALWriteFailed: a batch holding records that were only submitted (nobody
                waited for them) failed since the last flush.
            LeaseLost: this writer was fenced.
            SagaUsageError: called inside ``exclusive()`` from the same thread.
        """
        self._not_in_exclusive()
        batch = self._flush_target()
        if batch is not None:
            batch.event.wait()
        self._raise_unreported()

    async def flush_async(self) -> None:
        """Like :meth:`flush`, but awaits without blocking the event loop.

        Raises:
            WALWriteFailed: as for :meth:`flush`.
            LeaseLost: as for :meth:`flush`.
            SagaUsageError: as for :meth:`flush`.
        """
        self._not_in_exclusive()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            batch = self._current if self._pending else self._inflight
            if self._pending:
                self._wanted = True
                if self._flusher_idle:
                    self._wake_flusher_locked()
            if batch is not None and not batch.done:
                self._add_waiter(batch, fut, loop)
            else:
                fut.set_result(None)
        with contextlib.suppress(WALWriteFailed, LeaseLost):
            await fut  # the batch error is reported below, once
        self._raise_unreported()

    def close(self) -> None:
        """Flush, stop the threads, mark the lease released. Idempotent.

        Raises:
            WALWriteFailed: a batch of only-submitted records failed since the last flush.
            LeaseLost: only-submitted records were refused because the writer is fenced.
        """
        if not self._stop_threads():
            return
        with self._plock:
            # "Released" tells recovery that this owner ended every saga it began. After
            # a failed write that may be false (a saga_end may be what failed): leave the
            # lease to expire instead, so recovery treats its open sagas as orphaned.
            if not self._fenced and self.stats.failed_batches == 0:
                with contextlib.suppress(OSError):
                    self._lease.release()
        with self._io_lock, contextlib.suppress(OSError):
            os.close(self._fd)
            if self._admit_file is not None:
                self._admit_file.close()
        self._plock.close()
        _writers.forget(self)
        self._raise_unreported()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[ExclusiveHandle]:
        """Flush, then hold the cross-process append lock (recovery, compaction).

        While inside, other processes and this process's flusher cannot append; use
        the handle's ``append_locked``, not :meth:`append`.

        Yields:
            A handle to read what others appended, append directly, and revoke leases.

        Raises:
            WALWriteFailed: flushing this writer's queue failed.
            LeaseLost: this writer is fenced.
        """
        self.flush()
        self._plock.acquire()
        self._exclusive_thread = threading.get_ident()
        handle = ExclusiveHandle(self)
        try:
            yield handle
        finally:
            handle._open = False
            self._exclusive_thread = None
            self._plock.release()


# ---------------------------------------------------------------------- registry

_writers: Registry[WALWriter] = Registry()


def open_writer(
    path: str | os.PathLike[str],
    *,
    encryptor: Encryptor | None = None,
    lease_seconds: float = 30.0,
    queue_limit: int = 65536,
    backpressure: Backpressure = "raise",
    block_timeout: float = 5.0,
    log_format: int | None = None,
    sync_on_loop: bool | None = None,
) -> WALWriter:
    """Return this process's writer for ``path``, creating it on first use.

    The options apply only when the writer is created; later calls return the
    existing instance as is.

    Args:
        path: The WAL file.
        encryptor: See :class:`WALWriter`.
        lease_seconds: See :class:`WALWriter`.
        queue_limit: See :class:`WALWriter`.
        backpressure: See :class:`WALWriter`.
        block_timeout: See :class:`WALWriter`.
        log_format: See :class:`WALWriter` (only for a log that does not exist yet).
        sync_on_loop: See :class:`WALWriter` (default: adaptive). Call
            ``open_writer(path, sync_on_loop=...)`` once at start-up: the sagas on
            ``path`` then share that writer.

    Returns:
        The shared writer.

    Raises:
        SagaUsageError: an argument is invalid.
        OSError: the WAL cannot be created.
    """
    key = _canonical(path)
    return _writers.shared(
        key,
        lambda: WALWriter(
            key,
            encryptor=encryptor,
            lease_seconds=lease_seconds,
            queue_limit=queue_limit,
            backpressure=backpressure,
            block_timeout=block_timeout,
            log_format=log_format,
            sync_on_loop=sync_on_loop,
        ),
    )


_canonical_paths: dict[str | tuple[str, str], str] = {}


def _canonical(path: str | os.PathLike[str]) -> str:
    """``realpath`` once per path (five syscalls saved on every saga's first record).

    A relative path is resolved against the current directory, so it is remembered
    together with it. A symbolic link re-pointed while the process runs keeps naming
    the file it named first: the open writer holds that file anyway.
    """
    found = _canonical_paths.get(path) if type(path) is str else None
    if found is not None:
        return found  # an absolute path seen before: every saga's common case
    p = os.fspath(path)
    key: str | tuple[str, str] = p if os.path.isabs(p) else (os.getcwd(), p)
    found = _canonical_paths.get(key)
    if found is None:
        found = _canonical_paths[key] = os.path.realpath(p)
    return found


def encryptor_of_open_writer(path: str | os.PathLike[str]) -> tuple[bool, Encryptor | None]:
    """Return ``(found, encryptor)`` of this process's open writer for ``path``.

    Lets what lives beside a log (the snapshot store) use the same key as the
    log's writer, also when the key was passed in code rather than by environment.
    """
    w = _writers.get(_canonical(path))
    if w is None:
        return False, None
    return True, w._encryptor
