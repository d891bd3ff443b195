"""How the file writer forms batches and who writes them (``docs/log-format.md`` §4).

A base class of :class:`~agent_saga.wal.writer.WALWriter`, on the queue shared with
the PostgreSQL writer (:class:`~agent_saga.wal._queue.QueueWriter`) and the file
half (:class:`~agent_saga.wal._log_file.LogFile`): the enqueue side (a lone caller
writes its own record, a waited append leads a batch, an event loop hands its
records over once per loop iteration or, with ``sync_on_loop``, writes a small batch
itself), the flusher thread, the write of one batch under the cross-process lock
with its one sync, and the lease each write checks first and a thread renews.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

from .._crash import crashpoint
from ..errors import LeaseLost, SagaUsageError, WALWriteFailed
from ._batch import _Batch
from ._batch import _fresh as _waiter_error
from ._log_file import LogFile
from ._queue import QueueWriter
from .admission import Metered, admit_frames_locked
from .format import encode_record
from .lease import OwnLease
from .reader import Damage, Record, scan, scan_open
from .salt import SaltPool

__all__ = ["INLINE_BATCH", "INLINE_SYNC_LIMIT", "FileBatches"]

#: With ``sync_on_loop``, the most records a batch may hold to be written on the
#: event loop's thread: a lone saga's batch (its record, perhaps a ``saga_begin``
#: submitted before it). Larger batches mean concurrent sagas, whose syncs should
#: overlap the loop's work on the flusher thread.
INLINE_BATCH: int = 2

#: Adaptive ``sync_on_loop``: the loop's thread writes a small batch itself only while
#: this log's syncs average (and the last one took) less than this many seconds.
INLINE_SYNC_LIMIT: float = 0.002


class FileBatches(QueueWriter, LogFile):
    """Batching, flushing and the lease of the file writer (a base class of :class:`WALWriter`).

    ``_pending`` holds encoded frames; ``_wanted`` is True once someone waits for
    them; ``_writing`` while a batch is being written (one at a time, in order);
    ``_kicks`` the event loops with a hand-off scheduled; ``_io_lock`` guards
    ``_fd`` between the flusher and ``exclusive()``; ``_deadline`` is when the
    lease stops being trusted (monotonic).
    """

    _pending: list[bytes | Metered]
    _admit_file: BinaryIO | None = None  # kept open to read others' appends for admissions
    _admit_generation: int = -1
    _salts: SaltPool
    _wanted: bool
    _kicks: set[asyncio.AbstractEventLoop]
    _loop_handoff: bool
    _sync_on_loop: bool | None
    _sync_avg: float = 0.0  # this log's recent syncs: moving average (seconds)
    _sync_last: float = 0.0
    _writing: bool
    _io_lock: threading.Lock
    _lease: OwnLease
    _lease_seconds: float
    _margin: float
    _deadline: float

    # ------------------------------------------------------------------ enqueue side

    def _enqueue(
        self,
        data: bytes | Metered,
        fut: asyncio.Future[None] | None,
        loop: asyncio.AbstractEventLoop | None,
        block: bool = True,
        waited: bool = True,
        lead: bool = False,
        kick: bool = False,
    ) -> _Batch:
        if self._defunct:
            raise SagaUsageError(
                "this WAL writer belongs to the parent process; call open_writer() in the child"
            )
        with self._lock:
            if self._closing or self._fenced:
                self._raise_unusable()
            if len(self._pending) >= self._limit:
                self._wait_for_room(block)
            self._pending.append(data)
            batch = self._current
            if waited:
                self._wanted = True
            else:
                batch.unwaited = True
            if fut is not None and loop is not None:
                self._add_waiter(batch, fut, loop)
            if lead and not self._writing:
                self._take_batch_locked()
                batch.leader = threading.get_ident()
            elif self._flusher_idle and waited:
                if kick and loop is not None and self._loop_handoff:
                    if loop not in self._kicks:
                        self._kicks.add(loop)
                        loop.call_soon(self._kick, loop)
                else:
                    self._wake_flusher_locked()
            return batch

    def _lead_inline(self, data: bytes | Metered) -> _Batch | None:
        """``sync_on_loop``: write ``data`` (and what is pending) on this thread now.

        Returns the written batch, or None when another batch is being written or
        too much is pending (then the caller queues ``data`` as usual).
        """
        with self._lock:
            if (
                self._writing
                or self._closing
                or self._fenced
                or self._defunct
                or len(self._pending) >= INLINE_BATCH
            ):
                return None
            self._pending.append(data)
            self._wanted = True
            batch = self._take_batch_locked()
            batch.leader = threading.get_ident()
            self.stats.inline_batches += 1
        self._write_and_complete(batch)
        return batch

    def _fast(self) -> bool:
        """Whether the loop's thread may write a small batch itself now (``sync_on_loop``)."""
        mode = self._sync_on_loop
        if mode is not None:
            return mode
        return self._sync_avg < INLINE_SYNC_LIMIT and self._sync_last < INLINE_SYNC_LIMIT

    def _timed_sync(self) -> None:
        """``_sync``, timed: the adaptive ``sync_on_loop`` decides from these durations."""
        start = time.perf_counter()
        try:
            self._sync()
        finally:
            took = time.perf_counter() - start
            self._sync_last = took
            self._sync_avg += (took - self._sync_avg) * 0.25

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        # Runs on ``loop`` after the callbacks that were ready with the first record:
        # every record they appended meanwhile goes to the flusher in this one wake-up
        # or, with sync_on_loop and a small batch, is written right here.
        with self._lock:
            self._kicks.discard(loop)
            if not (self._flusher_idle and not self._writing and self._flush_due_locked()):
                return
            inline = self._sync_on_loop is True or (
                self._sync_on_loop is None
                and not getattr(loop, "_ready", True)  # nothing else runnable right now
                and self._fast()
            )
            if not inline or len(self._pending) > INLINE_BATCH or self._defunct:
                self._wake_flusher_locked()
                return
            batch = self._take_batch_locked()
            batch.leader = threading.get_ident()
            self.stats.inline_batches += 1
        self._write_and_complete(batch)  # blocks this loop for one write + sync

    def _wake_flusher_locked(self) -> None:
        self._flusher_idle = False
        self.stats.wakeups += 1
        self._cond.notify()

    def _flush_due_locked(self) -> bool:
        # Called holding self._lock: does the flusher have a batch to write now?
        # Pending records are written once someone waits for them, a submitter waits
        # for room, or the writer closes; never merely because they exist.
        return bool(self._pending) and (self._wanted or self._blocked > 0 or self._closing)

    def _flush_target(self) -> _Batch | None:
        with self._lock:
            if self._pending:
                self._wanted = True
                if self._flusher_idle:
                    self._wake_flusher_locked()  # submitted records wait for no one else
                return self._current
            return self._inflight

    def _fresh(self, err: BaseException) -> BaseException:
        return _waiter_error(err, self.path)

    # ------------------------------------------------------------------ flusher side

    def _run_flusher(self) -> None:
        while True:
            with self._lock:
                while self._writing or not self._flush_due_locked():
                    if self._closing and not self._pending and not self._writing:
                        return
                    self._flusher_idle = True
                    self._cond.wait()
                self._flusher_idle = False
                batch = self._take_batch_locked()
            self._write_and_complete(batch)

    def _take_batch_locked(self) -> _Batch:
        # Called holding self._lock: the caller becomes the one writer of this batch.
        batch = self._current
        batch.frames, self._pending, self._current = self._pending, [], _Batch()
        self._wanted = False
        self._inflight = batch
        self._writing = True
        if self._blocked:
            self._room.notify_all()
        return batch

    def _write_and_complete(self, batch: _Batch) -> None:
        try:
            batch.error = self._write_batch(batch.frames)
        finally:
            batch.frames = []
            self._complete(batch)

    def _write_batch(self, frames: list[bytes | Metered]) -> BaseException | None:
        try:
            data = b"".join(frames)  # type: ignore[arg-type]
            metered = False
        except TypeError:  # metered intents: judged below, holding the lock
            data, metered = b"", True
        try:
            self._plock.acquire()
            locked = True
            self._io_lock.acquire()
            try:
                self._ensure_lease_locked()
                prepared = None
                if metered:
                    prepared = self._prepare_append_locked()  # finds the end of the data
                    frames = self._admit_locked(frames)  # type: ignore[assignment]
                    data = b"".join(frames)  # type: ignore[arg-type]
                    if not data and not prepared:  # every intent refused: nothing to write
                        return None
                crashpoint("wal.before_write")
                self._write_locked(data, prepared)
                crashpoint("wal.after_write")
                # Other processes may append while we fsync: fsync covers our bytes either way.
                self._plock.release()
                locked = False
                self._timed_sync()
                crashpoint("wal.after_fsync")
                self.stats.fsyncs += 1
                self.stats.batches += 1
                self.stats.records_written += len(frames)
                self.stats.bytes_written += len(data)
            finally:
                self._io_lock.release()
                if locked:
                    self._plock.release()
        except LeaseLost as exc:
            self.stats.failed_batches += 1
            return exc
        except Exception as exc:  # OSError, or anything a custom seam raises
            self.stats.failed_batches += 1
            err = WALWriteFailed(
                f"writing {len(frames)} record(s) to {self.path} failed ({exc!r}); "
                "they are not durable",
                path=self.path,
            )
            err.__cause__ = exc
            return err
        return None

    def _admit_locked(self, frames: list[bytes | Metered]) -> list[bytes]:
        """Admit the batch's metered intents against the log's usage (``wal/admission.py``).

        Called holding the append lock: what other processes appended is read from
        the file, so no one can append between the check and the write.
        """
        encryptor = self._encryptor
        salts = self._salts
        end = self._known_end  # where the data ends: the zeros of format 2 are not read
        f = self._admit_file
        if f is None or self._admit_generation != self._generation:
            if f is not None:
                f.close()
            f = self._admit_file = open(self.path, "rb", buffering=0)  # noqa: SIM115
            self._admit_generation = self._generation

        def read_from(offset: int) -> Iterator[Record | Damage]:
            if end is None:
                return scan(self.path, start=offset, decryptor=encryptor)
            return scan_open(f, self.path, start=offset, end=end, decryptor=encryptor)

        def encode(record: Mapping[str, Any]) -> bytes:
            return encode_record(record, encryptor, salts.for_record(record))

        return admit_frames_locked(
            self, frames, read_from, time.time(), encode, generation=self._generation
        )

    def _batch_done_locked(self) -> None:
        self._writing = False
        if self._closing or self._flush_due_locked():
            self._wake_flusher_locked()

    # ------------------------------------------------------------------ lease

    def _ensure_lease_locked(self) -> None:
        # Called holding the process lock, before every write.
        if self._fenced:
            raise self._lease_lost()
        if time.monotonic() > self._deadline and not self._renew_locked():
            raise self._lease_lost()

    def _renew_locked(self) -> bool:
        start = time.monotonic()
        if not self._lease.renew():
            self._fenced = True
            with self._lock:
                self._room.notify_all()
            return False
        self._deadline = start + self._lease_seconds - self._margin
        return True

    def _run_renewer(self) -> None:
        interval = self._lease_seconds / 3
        while not self._stop.wait(interval):
            if not self._io.renewals.is_set():
                continue
            with self._plock:
                if self._stop.is_set():
                    return
                try:
                    if not self._renew_locked():
                        return
                except OSError:
                    pass  # transient: the flusher renews before writing once the deadline passes
