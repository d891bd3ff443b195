"""The queue half of a group-commit writer, shared by the file and PostgreSQL backends.

Both writers (``wal/writer.py``, ``wal/pg/_writer.py``) queue encoded records under
one lock, hand them to one flusher thread in batches, and release every waiter of
a batch together (``docs/log-format.md`` §4). What differs is the I/O — ``pwrite``
+ ``fdatasync`` into a file, or one ``append_batch`` statement — and when the
flusher is woken. :class:`QueueWriter` holds the rest once: the queue's state, the
bounded queue's backpressure, fencing and usage errors, the waiters of a batch and
their release, and the stopping of the two threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from ..errors import LeaseLost, SagaUsageError, WALFull
from ._batch import WriterStats, _Batch

__all__ = ["Backpressure", "QueueWriter", "check_queue_args"]

Backpressure = Literal["raise", "block"]


class QueueWriter:
    """Queue, waiters, backpressure and fencing of a group-commit writer (a base class).

    A subclass calls :meth:`_init_queue` in its constructor, starts ``_flusher`` and
    ``_renewer`` threads (and sets ``_stop``), and supplies :meth:`_fresh` (the
    error a waiter gets) and :meth:`_wake_flusher_locked`; it may extend
    :meth:`_batch_done_locked`. Names follow the writers' own: ``_lock`` guards
    everything below it, ``_cond`` wakes the flusher, ``_room`` wakes submitters
    waiting for room.
    """

    path: str
    owner: str
    stats: WriterStats
    _flusher: threading.Thread
    _renewer: threading.Thread
    _stop: threading.Event

    def _init_queue(
        self, queue_limit: int, backpressure: Backpressure, block_timeout: float
    ) -> None:
        """Set up the queue's state (validated by :func:`check_queue_args`)."""
        self._limit = queue_limit
        self._block = backpressure == "block"
        self._block_timeout = block_timeout
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # the flusher waits for work
        self._room = threading.Condition(self._lock)  # "block" submitters wait for room
        self._pending: list[Any] = []
        self._current = _Batch()
        self._inflight: _Batch | None = None
        self._flusher_idle = False
        self._blocked = 0
        self._closing = False
        self._closed = False
        self._fenced = False
        self._defunct = False  # set in a forked child: this object belongs to the parent
        self._unreported: BaseException | None = None
        self._exclusive_thread: int | None = None

    # ------------------------------------------------------------------ hooks

    def _fresh(self, err: BaseException) -> BaseException:
        """A new exception for one waiter of a failed batch (subclasses decide its type)."""
        raise NotImplementedError

    def _wake_flusher_locked(self) -> None:
        """Wake the flusher (called holding ``_lock``)."""
        raise NotImplementedError

    def _batch_done_locked(self) -> None:
        """A batch was completed (called holding ``_lock``); the file writer hooks in."""

    # ------------------------------------------------------------------ shared API

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called, or the writer belongs to a parent process.

        Either way ``open_writer`` / ``open_store(...).writer()`` open a new one.
        """
        return self._closed or self._defunct

    @property
    def fenced(self) -> bool:
        """True once this writer lost its lease; it then writes nothing, for good."""
        return self._fenced

    def check_fence(self) -> None:
        """Raise if this writer is fenced (cheap: one attribute read).

        Raises:
            LeaseLost: the lease was revoked; a recovery daemon owns the sagas now.
        """
        if self._fenced:
            raise self._lease_lost()

    # ------------------------------------------------------------------ internals

    def _lease_lost(self) -> LeaseLost:
        return LeaseLost(
            f"WAL writer {self.owner} lost its lease on {self.path}: a recovery daemon "
            "owns its sagas now; stop and record nothing more"
        )

    def _raise_unusable(self) -> None:
        if self._fenced:
            raise self._lease_lost()
        raise SagaUsageError(f"WAL writer for {self.path} is closed")

    def _not_in_exclusive(self) -> None:
        if self._exclusive_thread == threading.get_ident():
            raise SagaUsageError(
                f"append/flush inside {type(self).__name__}.exclusive() would deadlock; "
                "use append_locked"
            )

    def _raise_unreported(self) -> None:
        with self._lock:
            err, self._unreported = self._unreported, None
        if err is not None:
            raise self._fresh(err) from err.__cause__

    def _add_waiter(
        self, batch: _Batch, fut: asyncio.Future[None], loop: asyncio.AbstractEventLoop
    ) -> None:
        loops = batch.loops
        if loops is None:
            batch.loops = {loop: [fut]}
        else:
            lst = loops.get(loop)
            if lst is None:
                loops[loop] = [fut]
            else:
                lst.append(fut)

    def _wait_for_room(self, block: bool) -> None:
        # Called holding self._lock with the queue full.
        if not (self._block and block):
            raise WALFull(
                f"WAL queue is full ({self._limit} records waiting); nothing was dropped: "
                "retry, raise queue_limit, or use backpressure='block'",
                path=self.path,
            )
        deadline = time.monotonic() + self._block_timeout
        self._blocked += 1
        if self._flusher_idle:
            self._wake_flusher_locked()  # only-submitted records must make room now
        try:
            while len(self._pending) >= self._limit:
                if self._closing or self._fenced:
                    self._raise_unusable()
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._room.wait(remaining):
                    if len(self._pending) < self._limit:
                        break
                    raise WALFull(
                        f"WAL queue stayed full for {self._block_timeout}s; nothing was dropped",
                        path=self.path,
                    )
        finally:
            self._blocked -= 1

    def _complete(self, batch: _Batch) -> None:
        """Release every waiter of ``batch``: sync ones at once, each loop's in one call."""
        with self._lock:
            batch.done = True
            loops = batch.loops
            if self._inflight is batch:
                self._inflight = None
            if batch.error is not None and batch.unwaited:
                self._unreported = batch.error
            self._batch_done_locked()
        batch.event.set()
        if loops:
            for loop, futs in loops.items():
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                    loop.call_soon_threadsafe(_resolve, futs, batch.error, self._fresh)

    def _stop_threads(self) -> bool:
        """Mark the writer closed and join its threads; False if there is nothing to close.

        Nothing: it was closed already, or it belongs to the parent process (a
        forked child must not touch the parent's threads, file or connection).
        """
        if self._defunct:
            self._closed = True
            return False
        with self._lock:
            if self._closed:
                return False
            self._closed = self._closing = True
            self._cond.notify_all()
            self._room.notify_all()
        me = threading.current_thread()
        if me is not self._flusher:
            self._flusher.join()
        self._stop.set()
        if me is not self._renewer:
            self._renewer.join()
        return True


def check_queue_args(
    queue_limit: int, backpressure: Backpressure, block_timeout: float, lease_seconds: float
) -> None:
    """Validate the options both writers share.

    Raises:
        SagaUsageError: an argument is out of range.
    """
    if backpressure not in ("raise", "block"):
        raise SagaUsageError(f"backpressure must be 'raise' or 'block', not {backpressure!r}")
    if queue_limit < 1 or lease_seconds <= 0 or block_timeout < 0:
        raise SagaUsageError("queue_limit >= 1, lease_seconds > 0, block_timeout >= 0")


def _resolve(
    futs: list[asyncio.Future[None]],
    err: BaseException | None,
    fresh: Callable[[BaseException], BaseException],
) -> None:
    # Runs on the futures' loop; a waiter that was cancelled meanwhile is skipped.
    if err is None:
        for f in futs:
            if not f.done():
                f.set_result(None)
    else:
        for f in futs:
            if not f.done():
                f.set_exception(fresh(err))
