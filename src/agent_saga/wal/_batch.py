"""The WAL writer's small parts: its I/O seam, its counters, and one group-commit batch.

:class:`WriterIO` and :class:`WriterStats` are public (re-exported by
``agent_saga.wal.writer``); :class:`_Batch` and :func:`_fresh` are
what the writer uses to collect the records of one flush and release their waiters
(``docs/log-format.md`` §3-§6).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import LeaseLost, WALWriteFailed

__all__ = ["WriterIO", "WriterStats", "_Batch", "_fresh"]


def _set_event() -> threading.Event:
    e = threading.Event()
    e.set()
    return e


@dataclass(slots=True)
class WriterIO:
    """The writer's I/O seam, so tests can fail or stall I/O without monkeypatching.

    Attributes:
        write: ``os.write``-like; may write fewer bytes than given.
        fsync: ``os.fsync``-like (append layout, format 1).
        fdatasync: ``os.fdatasync``-like (preallocated layout, format 2).
        renewals: While cleared, the lease renewal thread skips its renewals (tests
            use it to simulate a stalled process).
    """

    write: Callable[[int, memoryview], int] = os.write
    fsync: Callable[[int], None] = os.fsync
    fdatasync: Callable[[int], None] = os.fdatasync
    renewals: threading.Event = field(default_factory=_set_event)


@dataclass(slots=True)
class WriterStats:
    """Counters of one writer (read them; never write them).

    Attributes:
        records_written: Records written and fsynced.
        batches: Successful batches (one write + one fsync each).
        fsyncs: Successful fsyncs.
        bytes_written: Bytes written in successful batches.
        failed_batches: Batches whose write or fsync failed, or that were fenced.
        tail_repairs: Torn tails this writer cut off before appending.
        wakeups: Times the flusher thread was woken for a batch (a hand-off from
            the caller's thread; fewer than ``batches`` when callers write their own).
        inline_batches: Batches an event loop's thread wrote itself (``sync_on_loop``).
    """

    records_written: int = 0
    batches: int = 0
    fsyncs: int = 0
    bytes_written: int = 0
    failed_batches: int = 0
    tail_repairs: int = 0
    wakeups: int = 0
    inline_batches: int = 0


class _Latch:
    """A one-shot event made of one lock: ``set`` once, ``wait`` any number of times.

    A ``threading.Event`` builds a Condition and two locks; a batch is made for
    every group commit, so its latch is one ``allocate_lock`` (the lock is held
    until the batch is done; each waiter takes and hands it back in turn).
    """

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        """Release every waiter, present and future (call once)."""
        self._lock.release()

    def wait(self) -> None:
        """Block until :meth:`set` was called."""
        self._lock.acquire()
        self._lock.release()


class _Batch:
    """Everything submitted between two flushes, and whoever waits for it."""

    __slots__ = ("done", "error", "event", "frames", "leader", "loops", "unwaited")

    def __init__(self) -> None:
        self.event = _Latch()
        self.frames: list[Any] = []  # encoded frames; a metered intent (admission.Metered)
        self.leader = 0  # thread id of a sync caller that writes this batch itself
        self.error: BaseException | None = None
        self.done = False
        # True when some record of the batch was only submitted: nobody waits for it,
        # so a failure must be reported by the next flush() instead.
        self.unwaited = False
        # loop -> futures of that loop: resolved with ONE call_soon_threadsafe per loop.
        self.loops: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] | None = None


def _fresh(err: BaseException, path: str) -> BaseException:
    """A new exception per waiter: one shared instance would accumulate tracebacks."""
    if isinstance(err, LeaseLost):
        return LeaseLost(str(err))
    return WALWriteFailed(str(err), path=path)
